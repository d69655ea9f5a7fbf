"""The checked, normalized form of a statement: what the language hands the engine.

The pipeline (tokens -> syntax tree -> checked query -> normalized factors) ends here.
Everything the engine needs about a query is in these frozen dataclasses; the engine never
sees SQL text or syntax trees. PSoup paper Sect. 3.2 splits a query specification into the
standing query clause (SELECT-FROM-WHERE: `Source` predicates and `SelectItem` s) and the
BEGIN-END clause (`Window`), which the engine keeps in its WindowsTable.

Values are Python scalars of the column's type: `int` for INT (and BOOL as 0/1 is NOT
used: BOOL values are `bool`), `float` for FLOAT, `str` for TEXT.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from psoup.options import ColumnTypeName
from psoup.strenum import StrEnum

Value = int | float | str | bool

#: The range of an INT value (64-bit, as numpy's int64 stores it).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class ColumnType(StrEnum):
    """A column's type. Each value is the type's lowercase name, which the journal, the
    protocol and `Engine.create_stream` use (`psoup.options.ColumnTypeName`); a member
    equals, hashes, serializes and formats as that name.

    Example:
        >>> ColumnType("int") is ColumnType.INT, ColumnType.INT == "int", f"{ColumnType.BOOL}"
        (True, True, 'bool')
        >>> from psoup.options import COLUMN_TYPE_NAMES
        >>> tuple(t.value for t in ColumnType) == COLUMN_TYPE_NAMES
        True
    """

    INT = "int"
    FLOAT = "float"
    TEXT = "text"
    BOOL = "bool"


#: The column types of the language.
TYPES = tuple(ColumnType)

#: Columns every stream has besides its declared ones (docs/language.md, "Streams").
TS = "ts"
TUPLE_ID = "tupleID"
IMPLICIT_COLUMNS = {TS: ColumnType.FLOAT, TUPLE_ID: ColumnType.INT}


class SourceKind(StrEnum):
    """Where a stream declared with FROM takes its tuples (docs/language.md, "Sources")."""

    FILES = "files"
    RATE = "rate"
    KAFKA = "kafka"


class SourceFormat(StrEnum):
    """How a FROM FILES source's files (or a FROM KAFKA source's values) are written."""

    CSV = "csv"
    JSON = "json"
    PARQUET = "parquet"


#: The WITH option psoup reads itself: where a source's micro-batches are probed, in
#: the psoup process ('engine', the default) or in Spark's executors ('executors').
PROBE_OPTION = "probe"
PROBE_PLACES = ("engine", "executors")


@dataclass(frozen=True)
class StreamSource:
    """The FROM clause of a CREATE STREAM: a Spark source that feeds the stream.

    Attributes:
        kind: FILES, RATE or KAFKA.
        path: the folder FROM FILES watches (None for the others).
        format: the files' format (FILES), JSON or None (KAFKA), None (RATE).
        options: the WITH clause's (key, value) pairs, in order, passed to Spark's reader.
    """

    kind: SourceKind
    path: str | None = None
    format: SourceFormat | None = None
    options: tuple[tuple[str, str], ...] = ()

    @property
    def in_executors(self) -> bool:
        """WITH (probe = 'executors'): its micro-batches are probed in Spark's
        executors and kept in the stream's batch store (psoup.archive.batches)."""
        return any(k.lower() == PROBE_OPTION and v.lower() == "executors"
                   for k, v in self.options)

    def describe(self) -> str:
        """The clause as SHOW STREAMS shows it.

        Example:
            >>> StreamSource(SourceKind.FILES, "/in", SourceFormat.CSV, (("sep", ";"),)).describe()
            "FILES '/in' FORMAT CSV WITH (sep = ';')"
        """
        text = self.kind.upper()
        if self.path is not None:
            text += " '" + self.path.replace("'", "''") + "'"
        if self.format is not None:
            text += f" FORMAT {self.format.upper()}"
        if self.options:
            text += " WITH (" + ", ".join(
                f"{k} = '" + v.replace("'", "''") + "'" for k, v in self.options) + ")"
        return text


@dataclass(frozen=True, init=False)
class StreamSchema:
    """A stream declared by CREATE STREAM.

    Attributes:
        name: the stream's name.
        columns: (column name, type) pairs in declaration order; excludes ts and tupleID.
            Given as types or their names ("int"), kept as types.
        retain_seconds: RETAIN n <time unit>, in seconds; None when not given.
        retain_rows: RETAIN n ROWS; None when not given. At most one of the two is set.
        source: the FROM clause's Spark source; None for a stream fed by inserts.

    Example:
        >>> StreamSchema("R", [("a", "int")]).columns == (("a", ColumnType.INT),)
        True
    """

    name: str
    columns: tuple[tuple[str, ColumnType], ...]
    retain_seconds: float | None = None
    retain_rows: int | None = None
    source: StreamSource | None = None

    def __init__(self, name: str,
                 columns: Iterable[tuple[str, ColumnType | ColumnTypeName]],
                 retain_seconds: float | None = None, retain_rows: int | None = None,
                 source: StreamSource | None = None):
        # frozen: set once, here, as dataclasses' own __init__ would
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "columns", tuple((c, ColumnType(t)) for c, t in columns))
        object.__setattr__(self, "retain_seconds", retain_seconds)
        object.__setattr__(self, "retain_rows", retain_rows)
        object.__setattr__(self, "source", source)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    @cached_property
    def name_set(self) -> frozenset[str]:
        return frozenset(self.names)

    def type_of(self, column: str) -> ColumnType:
        """The type of a declared or implicit column (KeyError when unknown)."""
        for c, t in self.columns:
            if c == column:
                return t
        return IMPLICIT_COLUMNS[column]


@dataclass(frozen=True)
class TimeExpr:
    """A window edge: `NOW + offset` when `relative`, else the absolute epoch second `value`."""

    relative: bool
    value: float

    def resolve(self, now: float) -> float:
        return now + self.value if self.relative else self.value


class WindowType(StrEnum):
    """What a window selects (`Window.kind`):

        ALL:       everything retained (no BEGIN/END, or [RANGE UNBOUNDED]).
        RANGE:     tuples with begin.resolve(now) <= ts <= end.resolve(now); [NOW] is a
                   range whose both edges are NOW + 0; [RANGE 10 MINUTES] is NOW-600..NOW.
        ROWS:      the `rows` most recent tuples of the stream ([ROWS n], or
                   BEGIN (NOW - n ROWS) END NOW).
        PARTITION: the `rows` most recent tuples of each distinct value of the
                   `partition_by` columns ([PARTITION BY a, b ROWS n]).
    """

    ALL = "all"
    RANGE = "range"
    ROWS = "rows"
    PARTITION = "partition"


@dataclass(frozen=True)
class Window:
    """The input window of one FROM item, resolved against NOW only at invocation; its
    `kind` says which of the other fields it uses (`WindowType`). The window is taken
    first and WHERE filters inside it (docs/language.md, "Windows").
    """

    kind: WindowType = WindowType.ALL
    begin: TimeExpr | None = None
    end: TimeExpr | None = None
    rows: int | None = None
    partition_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class AttrPredicate:
    """All single-attribute factors of one query on one column, folded into one set.

    The set of values v it accepts is:
        if `eq` is not None:  v in eq                       (= and IN; already filtered
                                                              by the bounds and `ne`)
        else:                 lo <(=) v <(=) hi and v not in ne
    where a bound of None is unbounded and `lo_open`/`hi_open` make it strict. The checker
    folds INT columns compared with FLOAT constants to integer bounds (a > 2.5 is a >= 3,
    a = 2.5 is `empty`). `empty` marks a contradiction on this column (a > 5 AND a < 3):
    legal, matches nothing.

    Attributes:
        column: the column's name (may be "ts" or "tupleID").
        ctype: the column's type.
    """

    column: str
    ctype: ColumnType
    lo: Value | None = None
    lo_open: bool = False
    hi: Value | None = None
    hi_open: bool = False
    eq: frozenset[Value] | None = None
    ne: frozenset[Value] = field(default_factory=frozenset)
    empty: bool = False


class CompareOp(StrEnum):
    """A comparison of two values, by its symbol (SQL's `<>` is NE, written `!=`)."""

    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


@dataclass(frozen=True)
class ColumnFactor:
    """A multi-attribute factor on one stream, `left op right + offset`, as written
    (PSoup's predicateList). `offset` is 0 for TEXT and BOOL columns (arithmetic on them
    is rejected by the checker), and an integer when both columns are INT
    (`integer_offset`)."""

    left: str
    op: CompareOp
    right: str
    offset: int | float = 0


@dataclass(frozen=True)
class JoinFactor:
    """A join factor between two FROM items (PSoup Sect. 3.2.2):
    `sources[left].left_column + left_offset op sources[right].right_column + offset`.

    Normalized so that `left < right`, by mirroring the comparison as written: `S.b >
    R.a + 2` with R first in FROM becomes `R.a + 2 < S.b` (left_offset 2), never `R.a <
    S.b - 2`, which is not the same comparison in floating point. At most one of the
    offsets is nonzero; both are 0 for TEXT and BOOL, and integers when both columns
    are INT. A self-join's two sources name the same stream under different aliases.
    """

    left: int
    left_column: str
    op: CompareOp
    right: int
    right_column: str
    offset: int | float = 0
    left_offset: int | float = 0


class SampleMethod(StrEnum):
    """A TABLESAMPLE method, by its keyword: BERNOULLI samples rows, SYSTEM whole row
    groups of the archive (its fraction rounded up to what they hold)."""

    BERNOULLI = "BERNOULLI"
    SYSTEM = "SYSTEM"


@dataclass(frozen=True)
class Sample:
    """`TABLESAMPLE method (percent)` on a FROM item: the archived part of its stream is
    read as a uniform random sample of `fraction` (0 < fraction < 1) of its tuples;
    tuples still in memory are read whole."""

    method: SampleMethod
    fraction: float


@dataclass(frozen=True)
class Source:
    """One item of the FROM list with the factors local to it.

    Attributes:
        stream: the stream's name.
        alias: the name the query uses for it (the stream's name when no alias).
        window: its input window (BEGIN/END applies the same window to every source).
        predicates: one AttrPredicate per column with single-attribute factors, sorted
            by column name.
        column_factors: the multi-attribute factors over this stream's columns.
        sample: TABLESAMPLE: how its archived part is sampled (None: read whole).
    """

    stream: str
    alias: str
    window: Window
    predicates: tuple[AttrPredicate, ...] = ()
    column_factors: tuple[ColumnFactor, ...] = ()
    sample: Sample | None = None


class Kept(StrEnum):
    """What a group keeps for an aggregate besides its row count (`AggregateFunction`)."""

    SUM = "sum"
    MIN = "min"
    MAX = "max"


@dataclass(frozen=True)
class AggregateFunction:
    """One aggregate function of the select list (PSoup Sect. 6), everything each layer
    needs to know of it in one row of `AGGREGATES`:

    Attributes:
        name: its lowercase name.
        numbers_only: its argument must be INT or FLOAT (else any type).
        star: it also takes `*` (COUNT(*)).
        keeps: what a group must keep for it besides its row count, by the structures
            of psoup.results.aggregates: None (the count is enough), SUM (prefix sums),
            or MIN / MAX (an annotation of the ranked tree).
        fold: the answer from a group's row count and what it keeps (None for an empty
            group's statistic): SQL's values, NULL (None) where it has none.
    """

    name: str
    numbers_only: bool
    star: bool
    keeps: Kept | None
    fold: Callable[[int, Any], Any]


#: The aggregate functions by lowercase name; the parser, the checker and the
#: structures all read this table (a new function is a new row here, and a structure
#: in psoup.results.aggregates if it keeps something new).
AGGREGATES: dict[str, AggregateFunction] = {f.name: f for f in (
    AggregateFunction("count", False, True, None, lambda n, _: n),
    AggregateFunction("sum", True, False, Kept.SUM, lambda n, s: s if n else None),
    AggregateFunction("avg", True, False, Kept.SUM, lambda n, s: s / n if n else None),
    AggregateFunction("min", True, False, Kept.MIN, lambda n, m: m if n else None),
    AggregateFunction("max", True, False, Kept.MAX, lambda n, m: m if n else None),
)}


@dataclass(frozen=True)
class SelectItem:
    """One output column: `source` indexes Query.sources; `column` may be ts or tupleID.

    `agg` is None for a plain column, else one of AGGREGATES applied to the column;
    COUNT(*) has `column == "*"` (and `source == 0`).
    """

    source: int
    column: str
    name: str
    agg: str | None = None


@dataclass(frozen=True)
class Query:
    """A checked, normalized standing query.

    Attributes:
        sql: the statement as the user wrote it.
        sources: the FROM list (one source for a selection query).
        select: the output columns, in order (`*` already expanded to declared columns).
        distinct: SELECT DISTINCT.
        contradiction: True when some factor can never hold; the query matches nothing.
        joins: the join factors between sources (empty for a selection query).
        group_by: the GROUP BY columns as (source, column) pairs, in the order written.
    """

    sql: str
    sources: tuple[Source, ...]
    select: tuple[SelectItem, ...]
    distinct: bool = False
    contradiction: bool = False
    joins: tuple[JoinFactor, ...] = ()
    group_by: tuple[tuple[int, str], ...] = ()

    @property
    def columns(self) -> list[str]:
        """The output column names (a new list each time: an answer keeps its own)."""
        return list(self._column_names)

    @cached_property
    def _column_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.select)

    @cached_property
    def aggregated(self) -> bool:
        """True when the answer is one row per group (aggregates or GROUP BY)."""
        return bool(self.group_by) or any(item.agg for item in self.select)

    def local(self, item: int) -> Query:
        """The factors on FROM item `item` alone, as a one-stream query over everything
        retained: what a join files in the Query SteM for that item, so that the one
        probe of a batch serves selections and joins alike (PSoup Sect. 3.2.2).

        Example:
            >>> q = Query("SELECT ...", (Source("R", "r", Window(WindowType.ROWS, rows=5)),
            ...                          Source("S", "S", Window())), ())
            >>> q.local(0).sql, q.local(0).sources[0].window.kind is WindowType.ALL
            ('SELECT ... [local to r]', True)
        """
        source = replace(self.sources[item], window=Window())
        return Query(f"{self.sql} [local to {source.alias}]", (source,), (),
                     contradiction=self.contradiction)


class CatalogAction(StrEnum):
    """What a catalog statement asks for (docs/language.md, "The catalog")."""

    SHOW_STREAMS = "show streams"
    SHOW_QUERIES = "show queries"
    DESCRIBE = "describe"
    DROP_STREAM = "drop stream"


# The actions by their former names, for code that imports them from here.
SHOW_STREAMS, SHOW_QUERIES = CatalogAction.SHOW_STREAMS, CatalogAction.SHOW_QUERIES
DESCRIBE, DROP_STREAM = CatalogAction.DESCRIBE, CatalogAction.DROP_STREAM


@dataclass(frozen=True)
class Catalog:
    """A checked catalog statement: SHOW STREAMS, SHOW QUERIES, DESCRIBE stream or
    DROP STREAM stream [CASCADE]. The stream, when there is one, exists.

    Attributes:
        action: what it asks for.
        stream: the stream described or dropped; None for SHOW.
        cascade: DROP STREAM ... CASCADE (unregister the queries reading the stream).
    """

    action: CatalogAction
    stream: str | None = None
    cascade: bool = False
