"""The choices a user passes to psoup, as types (after Polars' `_typing`).

Each option of the public API that takes one of a few words is a `Literal` here, so a
typo fails in the type checker and the docs list the choices; each is checked again at
run time by `choose`, for callers that are not type-checked (the CLI, the protocol).
Inside the engine a choice is an enum or a table entry, never a bare string.
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

#: `Engine(mode=...)`: PSoup-P, PSoup-C or NoMat (PSoup Sect. 5; psoup.results.modes).
ModeName = Literal["partial", "complete", "nomat"]

#: `Engine(sync=...)`: when the write-ahead log is forced to disk (psoup.journal.wal).
SyncName = Literal["always", "group", "off"]

#: `Engine(routing=...)`: the order of a join's probes (psoup.eddy.routing).
RoutingName = Literal["adaptive", "fixed"]

#: A column's type in CREATE STREAM and `Engine.create_stream` (psoup.query.model).
ColumnTypeName = Literal["int", "float", "text", "bool"]

_Choice = TypeVar("_Choice", bound=str)


def choose(option: str, value: object, choices: tuple[_Choice, ...]) -> _Choice:
    """`value` as one of `choices`, or ValueError naming the option and the choices.

    Example:
        >>> choose("mode", "nomat", get_args(ModeName))
        'nomat'
        >>> choose("mode", "fast", get_args(ModeName))
        Traceback (most recent call last):
        ...
        ValueError: unknown mode 'fast' (choose from partial, complete, nomat)
    """
    for choice in choices:
        if value == choice:
            return choice
    raise ValueError(f"unknown {option} {value!r} (choose from {', '.join(choices)})")


MODE_NAMES: tuple[ModeName, ...] = get_args(ModeName)
SYNC_NAMES: tuple[SyncName, ...] = get_args(SyncName)
ROUTING_NAMES: tuple[RoutingName, ...] = get_args(RoutingName)
COLUMN_TYPE_NAMES: tuple[ColumnTypeName, ...] = get_args(ColumnTypeName)
