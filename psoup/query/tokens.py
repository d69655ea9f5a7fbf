"""Tokens: the first stage of the language pipeline (SQL text -> tokens).

The tokenizer splits a statement into names, reserved keywords, numbers, strings and
symbols, each carrying the 1-based line and column where it starts, so that every later
stage can say where an error is (docs/language.md, "Errors"). Keywords are case-insensitive;
names keep their case, since identifiers are case-sensitive.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from psoup.errors import QueryError
from psoup.strenum import StrEnum


class TokenType(StrEnum):
    """A token's kind (as sqlglot's TokenType): what the parser dispatches on."""

    NAME = "name"
    KEYWORD = "keyword"
    NUMBER = "number"
    STRING = "string"
    SYMBOL = "symbol"
    EOF = "eof"


# The kinds by their former names, for code that imports them from here.
NAME, KEYWORD, NUMBER = TokenType.NAME, TokenType.KEYWORD, TokenType.NUMBER
STRING, SYMBOL, EOF = TokenType.STRING, TokenType.SYMBOL, TokenType.EOF

#: Statement structure and constants; none of these can name a stream, alias or column.
STRUCTURE_KEYWORDS = frozenset(
    {
        "SELECT", "FROM", "WHERE", "AND", "BEGIN", "END", "AS", "DISTINCT",
        "BETWEEN", "IN", "CREATE", "NOW", "TRUE", "FALSE", "GROUP", "TABLESAMPLE",
    }
)  # fmt: skip

#: Keywords of SQL features the language rejects, with the message they are rejected with.
UNSUPPORTED_KEYWORDS = {
    "OR": "OR is not supported (a WHERE clause is a conjunction of factors joined by AND)",
    "NOT": "NOT is not supported (a WHERE clause is a conjunction of factors joined by AND)",
    "HAVING": "HAVING is not supported yet (WHERE filters the tuples before grouping; "
              "groups cannot be filtered)",
    "ORDER": "ORDER BY is not supported (results are ordered by ts, then tupleID)",
    "LIMIT": "LIMIT is not supported",
    "UNION": "UNION is not supported",
    "INTERSECT": "INTERSECT is not supported",
    "EXCEPT": "EXCEPT is not supported",
    "JOIN": "JOIN is not supported: list the streams in FROM and compare their columns in "
            "WHERE (FROM R, S WHERE R.a = S.b)",
    "EXISTS": "subqueries are not supported",
    "IS": "IS is not supported (there are no NULLs: every tuple gives every column)",
    "NULL": "NULL is not supported (there are no NULLs: every tuple gives every column)",
    "LIKE": "LIKE is not supported",
    "CASE": "CASE is not supported",
    "WITH": "WITH is not supported",
}

RESERVED = STRUCTURE_KEYWORDS | frozenset(UNSUPPORTED_KEYWORDS)

#: Longest first, so that '<=' is one token rather than '<' and '='.
_SYMBOLS = ("<=", ">=", "<>", "!=", "=", "<", ">", "(", ")", ",", ".", ";", "[", "]", "*", "+", "-")

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_identifier(text: object) -> bool:
    """Whether `text` is a string the language reads as one name (letters, digits, _).

    Example:
        >>> is_identifier("lane_3"), is_identifier("3lane"), is_identifier("a b")
        (True, False, False)
    """
    return isinstance(text, str) and _WORD.fullmatch(text) is not None

_NUMBER_TAIL = re.compile(r"[A-Za-z0-9_.]+")

#: One token (or a newline, or a comment) after any run of spaces: one regex match per
#: token, told apart by the name of the group that matched. Digits and letters are
#: ASCII: any other character is refused by name. A quote that opens no whole string is
#: `open`.
#: Words, the commonest tokens, are tried first (no other kind starts with a letter or
#: _); a comment before the `-` symbol, a number before the `.` one.
_TOKEN = re.compile("[^\\S\\n]*(?:" + "|".join([
    r"(?P<word>[A-Za-z_][A-Za-z0-9_]*)",
    r"(?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)",
    r"(?P<newline>\n)",
    r"(?P<comment>--[^\n]*)",
    r"(?P<string>'(?:[^']|'')*')",
    r"(?P<open>')",
    "(?P<symbol>" + "|".join(map(re.escape, _SYMBOLS)) + ")",
]) + ")")

_SPACE = re.compile(r"[^\S\n]*")


# The types as globals (read faster than an enum's attribute, in the tokenizer's loop
# and in the parser's tests of every token).
_NAME, _KEYWORD, _NUMBER = TokenType.NAME, TokenType.KEYWORD, TokenType.NUMBER
_STRING, _SYMBOL, _EOF = TokenType.STRING, TokenType.SYMBOL, TokenType.EOF
_WORDS = (_NAME, _KEYWORD)


class Pos(NamedTuple):
    """Where a token starts: 1-based line and column."""

    line: int
    column: int


class Token(NamedTuple):
    """One token (a named tuple: made ~20 times per statement, so made cheaply).

    Attributes:
        kind: the token's type.
        text: the token as written (a string literal keeps its quotes).
        value: int or float for a NUMBER, the unescaped text of a STRING, the upper-case
            keyword for a KEYWORD, else the text.
        pos: where the token starts.
    """

    kind: TokenType
    text: str
    value: int | float | str
    pos: Pos

    def is_word(self, *words: str) -> bool:
        """True for a name or keyword equal to one of `words` (upper case), ignoring case."""
        return self.kind in _WORDS and self.text.upper() in words

    def is_symbol(self, *symbols: str) -> bool:
        """True for a symbol among `symbols`."""
        return self.kind is _SYMBOL and self.text in symbols

    def describe(self) -> str:
        """The token as error messages quote it."""
        if self.kind is _EOF:
            return "the end of the statement"
        if self.kind is _STRING:
            return f"string {self.text}"
        return f"'{self.text}'"


def tokenize(sql: str) -> list[Token]:
    """Split a statement into tokens, ending with one EOF token.

    Whitespace and `--` comments separate tokens and are dropped. Runs in O(len(sql)).

    Args:
        sql: the statement text.

    Returns:
        The tokens in order; the last one has kind TokenType.EOF.

    Raises:
        QueryError: an unterminated string, a malformed number or an unexpected character.

    Example:
        >>> [t.text for t in tokenize("SELECT a FROM R WHERE a >= -2.5 -- c")]
        ['SELECT', 'a', 'FROM', 'R', 'WHERE', 'a', '>=', '-', '2.5', '']
        >>> tokenize("b\\n  <> 'it''s'")[2].value, tokenize("b\\n  <> 'x'")[1].pos
        ("it's", Pos(line=2, column=3))
    """
    tokens: list[Token] = []
    append = tokens.append
    new = tuple.__new__                 # Token(...) and Pos(...) without their Python __new__
    line, line_start, expect = 1, 0, 0
    for m in _TOKEN.finditer(sql):
        group = m.lastgroup or "symbol"   # the regex group that matched (each is named)
        if m.start() != expect:
            break                       # a character no token starts with, at `expect`
        i, expect = m.span(group)       # the token ends the match
        text = sql[i:expect]
        if group == "word":
            upper = text.upper()
            pos = new(Pos, (line, i - line_start + 1))
            append(new(Token, (_KEYWORD, text, upper, pos)) if upper in RESERVED
                   else new(Token, (_NAME, text, text, pos)))
        elif group == "symbol":
            append(new(Token, (_SYMBOL, text, text, new(Pos, (line, i - line_start + 1)))))
        elif group == "number":
            pos = new(Pos, (line, i - line_start + 1))
            if _NUMBER_TAIL.match(sql, expect):
                bad = _NUMBER_TAIL.match(sql, i)
                raise QueryError(f"malformed number '{bad.group() if bad else text}'", *pos)
            append(new(Token, (_NUMBER, text, _number_value(text, pos), pos)))
        elif group == "newline":
            line, line_start = line + 1, expect
        elif group == "string":
            pos = new(Pos, (line, i - line_start + 1))
            if "\n" in text:
                line += text.count("\n")
                line_start = i + text.rindex("\n") + 1
            append(new(Token, (_STRING, text, text[1:-1].replace("''", "'"), pos)))
        elif group != "comment":
            raise QueryError("unterminated string: no closing single quote", line,
                             i - line_start + 1)
    spaces = _SPACE.match(sql, expect)
    expect = spaces.end() if spaces else expect
    if expect < len(sql):
        c = sql[expect]
        hint = " (strings are in single quotes)" if c == '"' else ""
        raise QueryError(f"unexpected character '{c}'{hint}", line, expect - line_start + 1)
    append(new(Token, (_EOF, "", "", new(Pos, (line, len(sql) - line_start + 1)))))
    return tokens


def _number_value(text: str, pos: Pos) -> int | float:
    if "." in text or "e" in text or "E" in text:
        value = float(text)
        if math.isinf(value):
            raise QueryError(f"number {text} is out of range", *pos)
        return value
    return int(text)
