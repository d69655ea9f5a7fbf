"""The syntax tree: a statement as written, before any stream schema is consulted.

The parser builds these nodes; the checker reads them. Nodes keep the position of the
token they start at (`pos`) so that checking errors can point into the statement, and
keep constants as written (`Literal.text`) so that messages can quote them. Nothing here
is resolved: names may be unknown, types may not match, windows may be inverted.

The nodes are slotted dataclasses, not frozen ones: a statement's tree is built once and
read once by the checker, and a frozen dataclass's __init__ (a call per field) costs
about four times as much, ~10% of compiling a query.
"""

from __future__ import annotations

from dataclasses import dataclass

from psoup.query.model import CatalogAction, SampleMethod
from psoup.query.timeparse import TimeUnit
from psoup.query.tokens import Pos


@dataclass(slots=True)
class Literal:
    """A constant: int or float (NUMBER, sign applied), str (string) or bool (TRUE/FALSE)."""

    pos: Pos
    value: int | float | str | bool
    text: str


@dataclass(slots=True)
class ColumnRef:
    """A column reference, `name` or `qualifier.name` (qualifier: a stream or an alias).

    Attributes:
        pos: where the reference starts; `name_pos`: where its column name starts.
    """

    pos: Pos
    qualifier: str | None
    name: str
    name_pos: Pos

    @property
    def display(self) -> str:
        return self.name if self.qualifier is None else f"{self.qualifier}.{self.name}"


@dataclass(slots=True)
class Shifted:
    """`column + amount` or `column - amount`, the right side of a multi-attribute factor."""

    pos: Pos
    column: ColumnRef
    sign: str
    amount: Literal


Operand = ColumnRef | Literal | Shifted


@dataclass(slots=True)
class Comparison:
    """A factor `left op right`; op as written (one of = != <> < <= > >=)."""

    pos: Pos
    left: Operand
    op: str
    right: Operand


@dataclass(slots=True)
class Between:
    """`column BETWEEN low AND high`."""

    pos: Pos
    column: ColumnRef
    low: Literal
    high: Literal


@dataclass(slots=True)
class InList:
    """`column IN (v1, v2, ...)`."""

    pos: Pos
    column: ColumnRef
    values: tuple[Literal, ...]


Factor = Comparison | Between | InList


@dataclass(slots=True)
class ColumnDef:
    """`name TYPE` in CREATE STREAM."""

    pos: Pos
    name: str
    type_name: str
    type_pos: Pos


@dataclass(slots=True)
class Retain:
    """`RETAIN amount unit`; unit is SECOND, MINUTE, HOUR, DAY or ROW."""

    pos: Pos
    amount: Literal
    unit: TimeUnit


@dataclass(slots=True)
class SourceClause:
    """`FROM kind ['path'] [FORMAT name] [WITH (key = 'value', ...)]` in CREATE STREAM;
    kind, format and keys as written."""

    pos: Pos
    kind: str
    path: Literal | None
    format: str | None
    format_pos: Pos | None
    options: tuple[tuple[str, str, Pos], ...]


@dataclass(slots=True)
class CreateStream:
    """CREATE STREAM name (columns) [RETAIN ...] [FROM source]."""

    pos: Pos
    name: str
    name_pos: Pos
    columns: tuple[ColumnDef, ...]
    retain: Retain | None
    source: SourceClause | None = None


@dataclass(slots=True)
class Star:
    """`*` or `qualifier.*` in a select list."""

    pos: Pos
    qualifier: str | None


@dataclass(slots=True)
class SelectColumn:
    """`column [AS alias]` in a select list."""

    pos: Pos
    column: ColumnRef
    alias: str | None


@dataclass(slots=True)
class SelectAggregate:
    """`function(column) [AS alias]` or `COUNT(*) [AS alias]` in a select list.

    Attributes:
        function: the aggregate's lowercase name, one of model.AGGREGATES.
        argument: the column aggregated; None for COUNT(*).
        text: the aggregate as written, for error messages (e.g. "Sum(R.a)").
    """

    pos: Pos
    function: str
    argument: ColumnRef | None
    alias: str | None
    text: str


SelectEntry = Star | SelectColumn | SelectAggregate


@dataclass(slots=True)
class RangeWindow:
    """`[RANGE amount [unit]]`, or `[RANGE UNBOUNDED]` when amount is None."""

    pos: Pos
    amount: Literal | None
    unit: TimeUnit


@dataclass(slots=True)
class RowsWindow:
    """`[ROWS count]`, or `[PARTITION BY columns ROWS count]` when partition_by is set."""

    pos: Pos
    count: Literal
    partition_by: tuple[ColumnRef, ...]


@dataclass(slots=True)
class NowWindow:
    """`[NOW]`."""

    pos: Pos


StreamWindow = RangeWindow | RowsWindow | NowWindow


@dataclass(slots=True)
class SampleClause:
    """`TABLESAMPLE method (percent)`."""

    pos: Pos
    method: SampleMethod
    percent: Literal


@dataclass(slots=True)
class FromItem:
    """`stream [alias] [window] [TABLESAMPLE ...]` in a FROM list; `alias_pos` is where
    the alias starts."""

    pos: Pos
    stream: str
    alias: str | None
    alias_pos: Pos | None
    window: StreamWindow | None
    sample: SampleClause | None = None


@dataclass(slots=True)
class NowTime:
    """`NOW`, or `NOW sign amount [unit]`; unit is SECOND, MINUTE, HOUR, DAY or ROW.

    Attributes:
        text: the time expression as written, for error messages.
    """

    pos: Pos
    text: str
    sign: str | None
    amount: Literal | None
    unit: TimeUnit


@dataclass(slots=True)
class TimeConstant:
    """A fixed time: epoch seconds (int or float Literal) or a quoted ISO-8601 string."""

    pos: Pos
    text: str
    value: Literal


TimeSpec = NowTime | TimeConstant


@dataclass(slots=True)
class BeginEnd:
    """`BEGIN begin END end`."""

    pos: Pos
    begin: TimeSpec
    end: TimeSpec


@dataclass(slots=True)
class Select:
    """SELECT [DISTINCT] items FROM sources [WHERE factors] [GROUP BY columns]
    [BEGIN ... END ...] (GROUP BY may also follow BEGIN/END); `group_by` as written,
    repeats included."""

    pos: Pos
    distinct: bool
    items: tuple[SelectEntry, ...]
    sources: tuple[FromItem, ...]
    where: tuple[Factor, ...]
    begin_end: BeginEnd | None
    group_by: tuple[ColumnRef, ...] = ()


@dataclass(slots=True)
class CatalogStatement:
    """SHOW STREAMS, SHOW QUERIES, DESCRIBE name or DROP STREAM name [CASCADE];
    `name_pos` is where the stream's name starts."""

    pos: Pos
    action: CatalogAction
    name: str | None = None
    name_pos: Pos | None = None
    cascade: bool = False


Statement = CreateStream | Select | CatalogStatement
