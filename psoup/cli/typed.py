"""Statements the CLI builds from what the user typed, and their errors told back in the
user's terms.

`psoup stream create NAME COLUMNS --retain SPAN` sends `CREATE STREAM NAME (COLUMNS)
RETAIN SPAN`; a QueryError's "line 1, column 43" points into that statement, which the
user never saw. `Typed` keeps where each typed piece sits in it, and `explain` turns the
position into "in --retain '1 hourz', at character 3".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_WHERE = re.compile(r"line (\d+), column (\d+): ")


@dataclass
class Typed:
    """A statement made of glue (label None) and pieces the user typed (labelled with
    the argument or option they came from).

    Example:
        >>> t = Typed([(None, "CREATE STREAM "), ("NAME", "s"), (None, " ("),
        ...            ("COLUMNS", "a FLOT"), (None, ")")])
        >>> t.sql
        'CREATE STREAM s (a FLOT)'
        >>> t.explain("line 1, column 20: unknown type 'FLOT'")
        "in COLUMNS 'a FLOT', at character 3: unknown type 'FLOT'"
    """

    pieces: list[tuple[str | None, str]]
    sql: str = field(init=False)

    def __post_init__(self) -> None:
        self.sql = "".join(text for _, text in self.pieces)

    def explain(self, message: str) -> str:
        """`message` with its leading "line L, column C: " (a position in `sql`) told as a
        position in the typed piece it falls in; a position in glue goes to the end of
        the typed piece before it. Messages without a position are returned as they are.
        Linear in the statement's length."""
        match = _WHERE.match(message)
        if match is None:
            return message
        lines = self.sql.split("\n")
        line, column = int(match[1]), int(match[2])
        offset = sum(len(text) + 1 for text in lines[:line - 1]) + column - 1
        rest = message[match.end():]
        start, blamed = 0, None
        for label, text in self.pieces:
            if label is not None:
                if offset < start + len(text):
                    if offset >= start:
                        return f"in {label} {text!r}, at character {offset - start + 1}: {rest}"
                    break
                blamed = (label, text)
            elif offset < start + len(text) and blamed is not None:
                break
            start += len(text)
        if blamed is None:
            return rest
        label, text = blamed
        return f"in {label} {text!r}, at its end: {rest}"
