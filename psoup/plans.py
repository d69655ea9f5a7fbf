"""What a handle names: a registered query with its Query SteM slots (PSoup Sect. 4.2).

A selection query holds one slot, its column in the Results Structure; a join holds one
slot per FROM item, each filed with the item's local query (the factors on it alone).
The Query SteM, the Eddy, the results structures and the engine's core all read plans,
so they live below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from psoup.query.model import TS, TUPLE_ID, Query


@dataclass(frozen=True, eq=False)
class SelectionPlan:
    """A registered selection query and its slot (its column in the Results Structure)."""

    slot: int
    query: Query

    @property
    def id(self) -> int:
        """The query's id in the WindowsTable and the Results Structure: its slot."""
        return self.slot

    @cached_property
    def selected(self) -> list[str]:
        """The stream columns its SELECT list shows, in order."""
        return [item.column for item in self.query.select]

    @cached_property
    def shown(self) -> list[str]:
        """The selected columns, each once."""
        return list(dict.fromkeys(self.selected))

    @cached_property
    def fetched(self) -> list[str]:
        """The columns an answer reads from the Data SteM: the selected ones, ts and
        tupleID, each once."""
        return list(dict.fromkeys(self.selected + [TS, TUPLE_ID]))


@dataclass(frozen=True, eq=False)
class JoinPlan:
    """A registered join query: its id, and the Query SteM slot and local query of each
    FROM item (`locals[i]` = `query.local(i)`, the factors on item i alone)."""

    jid: int
    query: Query
    slots: tuple[int, ...]
    locals: tuple[Query, ...]

    @property
    def id(self) -> int:
        """The query's id in the WindowsTable: its first slot."""
        return self.jid


#: What a handle names: a selection or a join query with its slots.
Plan = SelectionPlan | JoinPlan


def filed(plan: Plan) -> list[tuple[int, Query]]:
    """The (slot, one-stream query) pairs a plan files in the Query SteM. O(FROM items)."""
    if isinstance(plan, SelectionPlan):
        return [(plan.slot, plan.query)]
    return list(zip(plan.slots, plan.locals, strict=True))
