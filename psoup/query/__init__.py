"""The psoup query language: SQL text -> the checked, normalized `model` the engine runs.

The pipeline (sqlglot-style, one pure stage per module):
    tokens.tokenize -> parser.parse -> checker.check -> normalize.normalize_factors
ending in `model.StreamSchema` (CREATE STREAM), `model.Query` (SELECT) or
`model.Catalog` (SHOW, DESCRIBE, DROP STREAM). The language is specified in
docs/language.md; errors are `psoup.errors.QueryError` with a line and column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from psoup.errors import LimitError, QueryError
from psoup.query.checker import check, check_retain, parse_type
from psoup.query.model import Catalog, Query, StreamSchema
from psoup.query.parser import parse, parse_retention
from psoup.query.syntax import Select
from psoup.query.tokens import is_identifier

__all__ = ["compile_statement", "create_stream_sql", "parse_retain", "parse_type"]


def compile_statement(sql: str, schemas: Mapping[str, StreamSchema],
                      max_factors: int | None = None) -> StreamSchema | Query | Catalog:
    """Compile one statement against the existing streams.

    Args:
        sql: one CREATE STREAM, SELECT, SHOW, DESCRIBE or DROP STREAM statement,
            optionally ending with `;`.
        schemas: the existing streams by name.
        max_factors: the most AND-ed factors a WHERE clause may have (None: any).

    Returns:
        The new stream's schema for CREATE STREAM; the checked, normalized query for
        SELECT (its `sql` is `sql` unchanged); a `Catalog` for the catalog statements.

    Raises:
        QueryError: anything wrong with the statement; nothing is registered.
        LimitError: a WHERE clause of more than `max_factors` factors.

    Example:
        >>> r = compile_statement("CREATE STREAM R (a INT, name TEXT) RETAIN 1 HOUR", {})
        >>> [(c, str(t)) for c, t in r.columns], r.retain_seconds
        ([('a', 'int'), ('name', 'text')], 3600.0)
        >>> q = compile_statement("SELECT name FROM R WHERE a BETWEEN 1 AND 4", {"R": r})
        >>> q.columns, (q.sources[0].predicates[0].lo, q.sources[0].predicates[0].hi)
        (['name'], (1, 4))
    """
    if not isinstance(sql, str):
        raise QueryError(f"a statement is a string of SQL, not {type(sql).__name__}")
    statement = parse(sql)
    if max_factors is not None and isinstance(statement, Select) and \
            len(statement.where) > max_factors:
        raise LimitError(f"a WHERE clause of {len(statement.where)} factors exceeds the "
                         f"limit of {max_factors}")
    return check(statement, schemas, sql)


def parse_retain(text: str) -> tuple[float | None, int | None]:
    """Parse a retention such as "1 hour", "90 seconds", "100000 rows" or "2 DAYS".

    Args:
        text: a positive number and a unit: SECOND(S), MINUTE(S), HOUR(S), DAY(S) or
            ROW(S), in any case.

    Returns:
        (retain_seconds, None) for a duration, (None, retain_rows) for a row count.

    Raises:
        QueryError: anything else.

    Example:
        >>> parse_retain("2 DAYS"), parse_retain("100000 rows")
        ((172800.0, None), (None, 100000))
    """
    return check_retain(parse_retention(text))


def create_stream_sql(
    name: str,
    columns: Mapping[str, str] | Sequence[tuple[str, str]],
    retain: str | None = None,
) -> str:
    """The CREATE STREAM statement of a stream declared from Python values.

    Args:
        name: the stream's name.
        columns: column name -> type name, in order. At run time any type name CREATE
            STREAM takes is accepted (`parse_type`: "double" is FLOAT).
        retain: the retention, as after RETAIN ("1 hour", "100 rows"); None: none.

    Raises:
        QueryError: a name that is not an identifier, or an unknown type name.

    Example:
        >>> create_stream_sql("R", {"a": "int", "b": "double"}, "1 hour")
        'CREATE STREAM R (a INT, b FLOAT) RETAIN 1 hour'
    """
    pairs = list(columns.items()) if isinstance(columns, Mapping) else list(columns)
    for ident in [name] + [c for c, _ in pairs]:
        if not is_identifier(ident):
            raise QueryError(f"{ident!r} is not a valid name (letters, digits, _)")
    cols = ", ".join(f"{c} {parse_type(t).upper()}" for c, t in pairs)
    return f"CREATE STREAM {name} ({cols})" + (f" RETAIN {retain}" if retain else "")
