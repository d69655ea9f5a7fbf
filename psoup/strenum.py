"""`StrEnum`: the engine's named choices as enums whose members are their own strings.

Python 3.11's `enum.StrEnum`, for Python 3.10 too: a member equals, hashes, serializes
(msgpack, JSON) and formats (`str()`, f-strings) as its value, so the journal, the
protocol and every message keep the words they had when these choices were plain strings.

Example:
    >>> class Color(StrEnum):
    ...     RED = "red"
    >>> Color.RED == "red", f"{Color.RED}", str(Color.RED), Color("red") is Color.RED
    (True, 'red', 'red', True)
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """An enum of strings that formats as its value (see the module docstring)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


