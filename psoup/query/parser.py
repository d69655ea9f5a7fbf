"""The parser: tokens -> syntax tree, by hand-written recursive descent.

The second stage of the language pipeline. The grammar is docs/language.md's; each rule is
one method, and every failure names what was expected, the token it came after and the
token found, at that token's line and column. SQL features the language does not have
(OR, NOT, HAVING, aggregates outside the select list, subqueries, ...) are recognized and
rejected by name rather than reported as plain syntax errors.
"""

from __future__ import annotations

from typing import NoReturn

from psoup.errors import QueryError
from psoup.query.model import (
    AGGREGATES,
    INT64_MAX,
    INT64_MIN,
    CatalogAction,
    SampleMethod,
    SourceKind,
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
    Operand,
    RangeWindow,
    Retain,
    RowsWindow,
    SampleClause,
    Select,
    SelectAggregate,
    SelectColumn,
    SelectEntry,
    Shifted,
    SourceClause,
    Star,
    Statement,
    StreamWindow,
    TimeConstant,
    TimeSpec,
)
from psoup.query.timeparse import TimeUnit, unit_name
from psoup.query.tokens import UNSUPPORTED_KEYWORDS, Pos, Token, TokenType, tokenize

# The token types as globals: the parser tests a token's type hundreds of times a
# statement, and a global is read faster than an enum's attribute.
_NAME, _KEYWORD, _NUMBER = TokenType.NAME, TokenType.KEYWORD, TokenType.NUMBER
_STRING, _EOF = TokenType.STRING, TokenType.EOF
_WORDS = (_NAME, _KEYWORD)

COMPARISON_OPS = ("=", "!=", "<>", "<", "<=", ">", ">=")

#: The deepest parentheses may nest in a WHERE clause or a time (a bound on the parser's
#: recursion: deeper nesting is a QueryError, not a RecursionError).
MAX_NESTING = 64
_AGGREGATE_NAMES = frozenset(name.upper() for name in AGGREGATES)
_ARITHMETIC = ("+", "-", "*")
_AGGREGATE_HERE = "aggregates are not supported here ({name})"

#: The words after CREATE STREAM ... FROM.
SOURCE_KINDS = tuple(kind.upper() for kind in SourceKind)

_TIME_UNITS = "a unit (SECONDS, MINUTES, HOURS or DAYS)"
_ANY_UNITS = "a unit (SECONDS, MINUTES, HOURS, DAYS or ROWS)"


def parse(sql: str) -> Statement:
    """Parse one statement (CREATE STREAM, SELECT, SHOW STREAMS, SHOW QUERIES,
    DESCRIBE or DROP STREAM), with an optional trailing `;`.

    Args:
        sql: the statement text.

    Returns:
        A `CreateStream`, `Select` or `CatalogStatement` syntax tree.

    Raises:
        QueryError: the text is empty, is not one statement of the grammar, or uses an
            unsupported SQL feature.

    Example:
        >>> stmt = parse("SELECT a FROM R WHERE a > 1")
        >>> stmt.items[0].column.name, stmt.where[0].op, stmt.where[0].right.value
        ('a', '>', 1)
    """
    return _Parser(tokenize(sql)).statement()


def parse_retention(text: str) -> Retain:
    """Parse a retention on its own, `n unit` as after RETAIN (e.g. "1 hour", "100 ROWS").

    Args:
        text: the retention text.

    Returns:
        A `Retain` node.

    Raises:
        QueryError: `text` is not a number followed by a unit.

    Example:
        >>> r = parse_retention("90 seconds")
        >>> r.amount.value, r.unit.value
        (90, 'SECOND')
    """
    parser = _Parser(tokenize(text))
    retain = parser.retain_amount()
    parser.end("the end of the retention")
    return retain


class _Parser:
    """Recursive descent over a token list; `_tok` is the next unconsumed token."""

    def __init__(self, tokens: list[Token]):
        self._tokens = tokens
        self._i = 0
        self._tok = tokens[0]           # the next unconsumed token: tokens[self._i]
        # the last consumed thing, for messages: its quoted text, or a token to quote
        self._after: str | Token | None = None
        self._depth = 0                 # parentheses open around the next token

    def _peek(self, k: int) -> Token:
        return self._tokens[min(self._i + k, len(self._tokens) - 1)]

    def _advance(self) -> Token:
        tok = self._tok
        if tok.kind is not _EOF:
            self._i += 1
            self._tok = self._tokens[self._i]
        self._after = tok
        return tok

    def _after_text(self) -> str:
        """' after <the last consumed thing>', or '' at the start."""
        after = self._after
        if isinstance(after, Token):
            after = after.text if after.kind is _STRING else f"'{after.text}'"
        return "" if after is None else f" after {after}"

    def _accept_word(self, word: str) -> Token | None:
        return self._advance() if self._tok.is_word(word) else None

    def _accept_symbol(self, symbol: str) -> Token | None:
        return self._advance() if self._tok.is_symbol(symbol) else None

    def _expect_word(self, word: str, expected: str | None = None) -> Token:
        return self._accept_word(word) or self._fail(expected or word)

    def _expect_symbol(self, symbol: str, expected: str | None = None) -> Token:
        return self._accept_symbol(symbol) or self._fail(expected or f"'{symbol}'")

    def _fail(self, expected: str) -> NoReturn:
        tok = self._tok
        if tok.kind is _KEYWORD and tok.value in UNSUPPORTED_KEYWORDS:
            raise QueryError(UNSUPPORTED_KEYWORDS[tok.value], *tok.pos)
        raise QueryError(f"expected {expected}{self._after_text()}, found {tok.describe()}",
                         *tok.pos)

    def _reject_subquery(self) -> None:
        if self._tok.is_symbol("(") and self._peek(1).is_word("SELECT"):
            raise QueryError("subqueries are not supported", *self._peek(1).pos)

    def end(self, expected: str) -> None:
        """Consume an optional `;` and require the end of the input."""
        if self._accept_symbol(";"):
            expected = "the end of the statement (one statement at a time)"
        if self._tok.kind is not _EOF:
            self._fail(expected)

    # statements

    def statement(self) -> Statement:
        tok = self._tok
        if tok.kind is _EOF or (tok.is_symbol(";") and self._peek(1).kind is _EOF):
            raise QueryError("empty statement")
        if tok.is_word("CREATE"):
            return self._create()
        if tok.is_word("SELECT"):
            return self._select()
        if tok.is_word("SHOW", "DESCRIBE", "DROP"):
            return self._catalog()
        self._fail("SELECT, CREATE STREAM, SHOW, DESCRIBE or DROP STREAM")

    def _catalog(self) -> CatalogStatement:
        """SHOW STREAMS | SHOW QUERIES | DESCRIBE name | DROP STREAM name [CASCADE]."""
        start = self._advance()
        verb = start.text.upper()
        if verb == "SHOW":
            if self._accept_word("STREAMS"):
                action = CatalogAction.SHOW_STREAMS
            else:
                self._expect_word("QUERIES", "STREAMS or QUERIES")
                action = CatalogAction.SHOW_QUERIES
            self.end("the end of the statement")
            return CatalogStatement(start.pos, action)
        if verb == "DROP":
            self._expect_word("STREAM")
        name, name_pos = self._name("a stream name")
        if verb == "DESCRIBE":
            self.end("the end of the statement")
            return CatalogStatement(start.pos, CatalogAction.DESCRIBE, name, name_pos)
        cascade = self._accept_word("CASCADE") is not None
        self.end("the end of the statement" if cascade else
                 "CASCADE or the end of the statement")  # fmt: skip
        return CatalogStatement(start.pos, CatalogAction.DROP_STREAM, name, name_pos,
                                cascade)

    def _create(self) -> CreateStream:
        start = self._advance()
        self._expect_word("STREAM")
        name, name_pos = self._name("a stream name")
        self._expect_symbol("(")
        columns = [self._column_def()]
        while self._accept_symbol(","):
            columns.append(self._column_def())
        self._expect_symbol(")", "',' or ')'")
        retain = None
        if self._accept_word("RETAIN"):
            retain = self.retain_amount()
        source = self._source() if self._tok.is_word("FROM") else None
        if source is not None:
            self.end("WITH or the end of the statement" if not source.options else
                     "the end of the statement")  # fmt: skip
        elif retain is not None:
            self.end("FROM or the end of the statement")
        else:
            self.end("RETAIN, FROM or the end of the statement")
        return CreateStream(start.pos, name, name_pos, tuple(columns), retain, source)

    def _source(self) -> SourceClause:
        """`FROM FILES 'dir' FORMAT f | FROM RATE | FROM KAFKA [FORMAT f]`, then an
        optional `WITH (key = 'value', ...)`."""
        start = self._advance()
        kind_tok = self._tok
        if not kind_tok.is_word(*SOURCE_KINDS):
            self._fail("a source (" + ", ".join(SOURCE_KINDS[:-1]) + " or "
                       f"{SOURCE_KINDS[-1]})")
        self._advance()
        kind = kind_tok.text.upper()
        path = None
        if kind == "FILES":
            if self._tok.kind is not _STRING:
                self._fail("a folder, as a 'quoted string'")
            path = self._literal_string()
        fmt, fmt_pos = None, None
        if self._accept_word("FORMAT"):
            fmt_pos = self._tok.pos
            fmt = self._word("a format (CSV, JSON or PARQUET)")
        options: list[tuple[str, str, Pos]] = []
        if self._accept_word("WITH"):
            self._expect_symbol("(")
            options.append(self._option())
            while self._accept_symbol(","):
                options.append(self._option())
            self._expect_symbol(")", "',' or ')'")
        return SourceClause(start.pos, kind, path, fmt, fmt_pos, tuple(options))

    def _literal_string(self) -> Literal:
        tok = self._advance()
        assert isinstance(tok.value, str), "a string token's value is its text"
        return Literal(tok.pos, tok.value, tok.text)

    def _option(self) -> tuple[str, str, Pos]:
        """`key = value`: a key of words joined by dots (kafka.bootstrap.servers) or a
        'quoted' one; a value quoted, a number or TRUE/FALSE, kept as text."""
        pos = self._tok.pos
        if self._tok.kind is _STRING:
            key = self._literal_string().value
        else:
            parts = [self._word("an option name")]
            while self._accept_symbol("."):
                parts.append(self._word("an option name"))
            key = ".".join(parts)
        self._expect_symbol("=", "'='")
        tok = self._tok
        if tok.kind is _STRING or tok.kind is _NUMBER:
            self._advance()
            value = tok.value if tok.kind is _STRING else tok.text
        elif tok.is_word("TRUE", "FALSE"):
            self._advance()
            value = tok.text.lower()
        else:
            self._fail("a value ('quoted', a number, TRUE or FALSE)")
        assert isinstance(value, str)
        return str(key), value, pos

    def _word(self, what: str) -> str:
        tok = self._tok
        if tok.kind not in _WORDS:
            self._fail(what)
        self._advance()
        return tok.text

    def _column_def(self) -> ColumnDef:
        name, pos = self._name("a column name")
        type_tok = self._tok
        if type_tok.kind is not _NAME:
            self._fail("a type (INT, FLOAT, TEXT or BOOL)")
        self._advance()
        return ColumnDef(pos, name, type_tok.text, type_tok.pos)

    def retain_amount(self) -> Retain:
        """`n unit` (the unit is required: a bare number could mean seconds or rows)."""
        amount = self._number("a number")
        return Retain(amount.pos, amount, self._unit(_ANY_UNITS, default=None))

    def _select(self) -> Select:
        start = self._advance()
        distinct = self._accept_word("DISTINCT") is not None
        items = [self._select_entry()]
        while self._accept_symbol(","):
            items.append(self._select_entry())
        last = items[-1]
        bare = isinstance(last, (SelectColumn, SelectAggregate)) and last.alias is None
        self._expect_word("FROM", "',', AS or FROM" if bare else "',' or FROM")
        sources = [self._from_item()]
        while self._accept_symbol(","):
            sources.append(self._from_item())
        where: tuple[Factor, ...] = ()
        if self._accept_word("WHERE"):
            where = tuple(self._conjunction())
        group_by = self._group_by() if self._tok.is_word("GROUP") else ()
        begin_end = self._begin_end() if self._tok.is_word("BEGIN") else None
        late_group_by = begin_end is not None and not group_by and self._tok.is_word("GROUP")
        if late_group_by:
            group_by = self._group_by()
        if group_by and self._tok.is_word("GROUP"):
            raise QueryError("GROUP BY appears twice", *self._tok.pos)
        if group_by and self._tok.is_word("WHERE"):
            raise QueryError("WHERE goes before GROUP BY", *self._tok.pos)
        if late_group_by:
            self.end("',' or the end of the statement")
        elif begin_end is not None:
            self.end("the end of the statement" if group_by else
                     "GROUP BY or the end of the statement")  # fmt: skip
        elif group_by:
            self.end("',', BEGIN or the end of the statement")
        elif where:
            self.end("AND, GROUP BY, BEGIN or the end of the statement")
        else:
            self.end("WHERE, GROUP BY, BEGIN or the end of the statement")
        return Select(
            start.pos, distinct, tuple(items), tuple(sources), where, begin_end, group_by
        )

    # names and constants

    def _name(self, what: str) -> tuple[str, Pos]:
        tok = self._tok
        if tok.kind is _KEYWORD:
            raise QueryError(f"expected {what}{self._after_text()}, found the reserved word "
                             f"'{tok.text}'", *tok.pos)
        if tok.kind is not _NAME:
            self._fail(what)
        self._advance()
        return tok.text, tok.pos

    def _column_ref(self, aggregate_error: str = _AGGREGATE_HERE) -> ColumnRef:
        """`name` or `qualifier.name`. A call `f(...)` is rejected; a call of an aggregate
        with `aggregate_error`, formatted with the aggregate's name as written."""
        tok = self._tok
        name, pos = self._name("a column")
        if self._tok.is_symbol("("):
            if name.upper() in _AGGREGATE_NAMES:
                raise QueryError(aggregate_error.format(name=name), *tok.pos)
            raise QueryError(f"functions are not supported ({name})", *tok.pos)
        ref = ColumnRef(tok.pos, None, name, pos)
        if self._accept_symbol("."):
            ref = ColumnRef(tok.pos, name, *self._name("a column name"))
        self._after = f"'{ref.display}'"
        return ref

    def _number(self, expected: str, signed: bool = False) -> Literal:
        tok = self._tok
        if signed and tok.is_symbol("-") and self._peek(1).kind is _NUMBER:
            self._advance()
            digits = self._advance()
            assert isinstance(digits.value, (int, float)), "a NUMBER token holds a number"
            lit = Literal(tok.pos, -digits.value, "-" + digits.text)
        elif tok.kind is _NUMBER:
            self._advance()
            lit = Literal(tok.pos, tok.value, tok.text)
        else:
            self._fail(expected)
        if isinstance(lit.value, int) and not INT64_MIN <= lit.value <= INT64_MAX:
            raise QueryError(f"integer {lit.text} is out of the 64-bit range", *lit.pos)
        return lit

    def _constant(self, expected: str) -> Literal:
        tok = self._tok
        if tok.kind is _STRING:
            self._advance()
            return Literal(tok.pos, tok.value, tok.text)
        if tok.is_word("TRUE", "FALSE"):
            self._advance()
            return Literal(tok.pos, tok.value == "TRUE", tok.text)
        return self._number(expected, signed=True)

    def _unit(self, expected: str, default: TimeUnit | None) -> TimeUnit:
        tok = self._tok
        unit = unit_name(tok.text) if tok.kind is _NAME else None
        if unit is not None:
            self._advance()
            return unit
        if default is None or tok.kind is _NAME:
            self._fail(expected)
        return default

    # SELECT list and FROM list

    def _select_entry(self) -> SelectEntry:
        tok = self._tok
        if self._accept_symbol("*"):
            return Star(tok.pos, None)
        if (tok.kind is _NAME and self._peek(1).is_symbol(".")
                and self._peek(2).is_symbol("*")):
            self._advance(), self._advance(), self._advance()
            return Star(tok.pos, tok.text)
        if tok.kind not in _WORDS:
            self._fail("a column or '*'")
        if (tok.kind is _NAME and tok.text.upper() in _AGGREGATE_NAMES
                and self._peek(1).is_symbol("(")):
            function, argument, text = self._aggregate()
            alias = self._name("a name after AS")[0] if self._accept_word("AS") else None
            return SelectAggregate(tok.pos, function, argument, alias, text)
        column = self._column_ref()
        alias = self._name("a name after AS")[0] if self._accept_word("AS") else None
        return SelectColumn(tok.pos, column, alias)

    def _aggregate(self) -> tuple[str, ColumnRef | None, str]:
        """`COUNT(*)` or `function(column)`: (lowercase function, column or None, text)."""
        name = self._advance().text
        function = name.upper()
        self._advance()  # (
        tok = self._tok
        argument = None
        if tok.is_word("DISTINCT"):
            raise QueryError(f"{function}(DISTINCT ...) is not supported", *tok.pos)
        if tok.is_symbol("*"):
            if not AGGREGATES[function.lower()].star:
                raise QueryError(f"{function}(*) is not supported: only COUNT takes *", *tok.pos)
            self._advance()
        elif tok.kind in _WORDS:
            argument = self._column_ref(
                f"nested aggregates are not supported ({{name}} inside {name})"
            )
            if self._tok.is_symbol(*_ARITHMETIC, *COMPARISON_OPS):
                raise _expression_error(function, self._tok.pos)
        elif tok.kind in (_NUMBER, _STRING) or tok.is_symbol("(", *_ARITHMETIC):
            raise _expression_error(function, tok.pos)
        else:
            self._fail("a column or '*'" if function == "COUNT" else "a column")
        self._expect_symbol(")")
        text = f"{name}({'*' if argument is None else argument.display})"
        self._after = f"'{text}'"
        return function.lower(), argument, text

    def _from_item(self) -> FromItem:
        self._reject_subquery()
        stream, pos = self._name("a stream name")
        alias, alias_pos = None, None
        if self._accept_word("AS") or self._tok.kind is _NAME:
            alias, alias_pos = self._name("an alias")
        window = self._stream_window() if self._tok.is_symbol("[") else None
        misplaced_alias = self._tok.kind is _NAME or self._tok.is_word("AS")
        if window is not None and alias is None and misplaced_alias:
            raise QueryError(
                f"the alias goes before the window: FROM {stream} alias [...]", *self._tok.pos
            )
        sample = self._sample() if self._tok.is_word("TABLESAMPLE") else None
        if sample is not None and self._tok.is_symbol("["):
            raise QueryError(f"the window goes before TABLESAMPLE: FROM {stream} [...] "
                             "TABLESAMPLE ...", *self._tok.pos)
        return FromItem(pos, stream, alias, alias_pos, window, sample)

    def _sample(self) -> SampleClause:
        pos = self._advance().pos
        method = self._tok
        if not (method.kind is _NAME and method.is_word("BERNOULLI", "SYSTEM")):
            self._fail("BERNOULLI or SYSTEM")
        self._advance()
        self._expect_symbol("(", "'(' and a percentage")
        percent = self._number("a percentage")
        self._expect_symbol(")")
        if self._tok.is_word("REPEATABLE"):
            raise QueryError("REPEATABLE is not supported: the archive's sample is drawn "
                             "once, when its rows are written", *self._tok.pos)
        return SampleClause(pos, SampleMethod(method.text.upper()), percent)

    def _stream_window(self) -> StreamWindow:
        pos = self._advance().pos
        window: StreamWindow
        if self._accept_word("RANGE"):
            if self._accept_word("UNBOUNDED"):
                window = RangeWindow(pos, None, TimeUnit.SECOND)
            else:
                amount = self._number("a number or UNBOUNDED")
                window = RangeWindow(pos, amount, self._unit(_TIME_UNITS, default=TimeUnit.SECOND))
        elif self._accept_word("ROWS"):
            window = RowsWindow(pos, self._number("a number of rows"), ())
        elif self._accept_word("PARTITION"):
            self._expect_word("BY")
            in_partition = "aggregates are not supported in PARTITION BY ({name})"
            columns = [self._column_ref(in_partition)]
            while self._accept_symbol(","):
                columns.append(self._column_ref(in_partition))
            self._expect_word("ROWS", "',' or ROWS")
            window = RowsWindow(pos, self._number("a number of rows"), tuple(columns))
        elif self._accept_word("NOW"):
            window = NowWindow(pos)
        else:
            self._fail("RANGE, ROWS, PARTITION BY or NOW")
        self._expect_symbol("]")
        return window

    # WHERE

    def _conjunction(self) -> list[Factor]:
        factors = self._term()
        while self._accept_word("AND"):
            factors.extend(self._term())
        return factors

    def _term(self) -> list[Factor]:
        self._reject_subquery()
        if self._open():
            factors = self._conjunction()
            self._close("AND or ')'")
            return factors
        return [self._factor()]

    def _open(self) -> bool:
        """Consume a '(' if it is next; each one nests the parser one call deeper, so
        they are bounded (deep nesting is an error, not a crash)."""
        tok = self._tok
        if not self._accept_symbol("("):
            return False
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise QueryError(f"parentheses nested more than {MAX_NESTING} deep", *tok.pos)
        return True

    def _close(self, expected: str | None = None) -> None:
        self._expect_symbol(")", expected)
        self._depth -= 1

    def _factor(self) -> Factor:
        left = self._operand()
        if isinstance(left, Shifted):
            raise _arithmetic_error(left)
        tok = self._tok
        if tok.is_word("BETWEEN", "IN"):
            if not isinstance(left, ColumnRef):
                raise QueryError(f"{tok.value} needs a column on its left", *tok.pos)
            self._advance()
            if tok.value == "BETWEEN":
                low = self._constant("a constant")
                self._expect_word("AND")
                return Between(left.pos, left, low, self._constant("a constant"))
            return InList(left.pos, left, self._in_values())
        if not tok.is_symbol(*COMPARISON_OPS):
            self._fail("a comparison operator")
        self._advance()
        right = self._operand()
        if isinstance(right, Shifted) and isinstance(left, Literal):
            raise _arithmetic_error(right)
        return Comparison(left.pos, left, tok.text, right)

    def _operand(self) -> Operand:
        tok = self._tok
        if tok.kind is _NAME:
            column = self._column_ref("aggregates are not supported in WHERE ({name})")
            sign = self._tok
            if not sign.is_symbol("+", "-"):
                return column
            self._advance()
            return Shifted(sign.pos, column, sign.text, self._number("a number", signed=True))
        if tok.is_word("NOW"):
            raise QueryError("NOW is only allowed in BEGIN and END, not in WHERE", *tok.pos)
        return self._constant("a column or a constant")

    def _in_values(self) -> tuple[Literal, ...]:
        self._reject_subquery()
        self._expect_symbol("(")
        values = [self._constant("a constant")]
        while self._accept_symbol(","):
            values.append(self._constant("a constant"))
        self._expect_symbol(")", "',' or ')'")
        return tuple(values)

    # GROUP BY

    def _group_by(self) -> tuple[ColumnRef, ...]:
        self._advance()
        self._expect_word("BY")
        in_group_by = "aggregates are not supported in GROUP BY ({name})"
        columns = [self._column_ref(in_group_by)]
        while self._accept_symbol(","):
            columns.append(self._column_ref(in_group_by))
        return tuple(columns)

    # BEGIN ... END

    def _begin_end(self) -> BeginEnd:
        pos = self._advance().pos
        begin = self._time()
        self._expect_word("END")
        return BeginEnd(pos, begin, self._time())

    def _time(self) -> TimeSpec:
        if self._open():
            spec = self._time()
            self._close()
            return spec
        start = self._i
        tok = self._tok
        if self._accept_word("NOW"):
            if not self._tok.is_symbol("+", "-"):
                return NowTime(tok.pos, self._text_since(start), None, None,
                               TimeUnit.SECOND)
            sign = self._advance().text
            amount = self._number("a number")
            unit = self._unit(_ANY_UNITS, default=TimeUnit.SECOND)
            return NowTime(tok.pos, self._text_since(start), sign, amount, unit)
        if tok.kind is _STRING:
            self._advance()
            return TimeConstant(tok.pos, tok.text, Literal(tok.pos, tok.value, tok.text))
        value = self._number("a time (NOW, NOW - n [unit], epoch seconds or a quoted timestamp)",
                             signed=True)  # fmt: skip
        return TimeConstant(tok.pos, self._text_since(start), value)

    def _text_since(self, start: int) -> str:
        return " ".join(t.text for t in self._tokens[start : self._i])


def _expression_error(function: str, pos: Pos) -> QueryError:
    argument = "a column or *" if function == "COUNT" else "a column"
    return QueryError(
        f"aggregates of expressions are not supported: the argument of {function} must be "
        f"{argument}",
        *pos,
    )


def _arithmetic_error(shifted: Shifted) -> QueryError:
    return QueryError(
        "arithmetic is only supported on the right-hand column of a comparison between "
        "two columns (a op b + c)",
        *shifted.pos,
    )
