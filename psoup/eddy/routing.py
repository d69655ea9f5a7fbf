"""Routing policies: the order in which a join's hybrid structs visit the Data SteMs
(PSoup Sect. 4.1, after Eddies; Golab Ch. 5.3 for the cost model).

A join step's cost is the number of structs it emits, so a good order keeps the
intermediate results small: it visits first the FROM items whose step emits the fewest
structs per struct that enters it. `AdaptiveOrder` learns that fan-out per (query,
item) from the steps it has seen, as an exponential moving average, and so follows the
data when selectivities drift; before it has seen a step it estimates the fan-out from
the candidates' count and the kind of factor linking them. `FixedOrder` follows the FROM
list, for comparison. Either way an order starts where the new entry is: at the FROM
item a new batch belongs to (Fig. 5), or, for a new query, at the item with the fewest
candidates (Fig. 4; FROM order for the fixed policy).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from psoup.eddy.hybrid import Step
from psoup.query.model import Query

#: Assumed fraction of candidates an unseen step matches, by its strongest link.
_GUESS = {"=": 0.01, "ineq": 0.3, "!=": 0.9, None: 1.0}


def _links(query: Query, new: int, joined: Sequence[int]) -> str | None:
    kinds = [f.op for f in query.joins
             if (f.left == new and f.right in joined) or (f.right == new and f.left in joined)]
    if "=" in kinds:
        return "="
    if any(op in ("<", "<=", ">", ">=") for op in kinds):
        return "ineq"
    return "!=" if kinds else None


class FixedOrder:
    """FROM order, each next item preferably one linked to those already joined."""

    name = "fixed"

    def start(self, key: Hashable, query: Query, sizes: Mapping[int, int]) -> int:
        return 0

    def order(self, key: Hashable, query: Query, first: int,
              sizes: Mapping[int, int]) -> list[int]:
        chosen = [first]
        rest = [i for i in range(len(query.sources)) if i != first]
        while rest:
            nxt = next((i for i in rest if _links(query, i, chosen)), rest[0])
            chosen.append(nxt)
            rest.remove(nxt)
        return chosen

    def observe(self, key: Hashable, steps: Sequence[Step]) -> None:
        pass

    def forget(self, key: Hashable) -> None:
        pass


class AdaptiveOrder(FixedOrder):
    """Greedy order by learned fan-out.

    Example:
        >>> from psoup.query.model import JoinFactor, Source, Window
        >>> q = Query("", tuple(Source(s, s, Window()) for s in "RST"), (),
        ...           joins=(JoinFactor(0, "a", "<", 1, "b"), JoinFactor(0, "a", "=", 2, "c")))
        >>> AdaptiveOrder().order("q", q, 0, {0: 10, 1: 100, 2: 100})
        [0, 2, 1]
    """

    name = "adaptive"

    def __init__(self, decay: float = 0.5):
        self.decay = decay
        self._fanout: dict[tuple[Hashable, int], float] = {}

    def start(self, key: Hashable, query: Query, sizes: Mapping[int, int]) -> int:
        return min(sizes, key=lambda i: (sizes[i], i))

    def order(self, key: Hashable, query: Query, first: int,
              sizes: Mapping[int, int]) -> list[int]:
        chosen = [first]
        rest = [i for i in range(len(query.sources)) if i != first]
        while rest:
            def cost(i: int) -> float:
                learned = self._fanout.get((key, i))
                if learned is not None:
                    return learned
                return sizes.get(i, 1) * _GUESS[_links(query, i, chosen)]
            nxt = min(rest, key=lambda i: (cost(i), i))
            chosen.append(nxt)
            rest.remove(nxt)
        return chosen

    def observe(self, key: Hashable, steps: Sequence[Step]) -> None:
        for step in steps:
            if step.structs_in:
                seen = step.structs_out / step.structs_in
                old = self._fanout.get((key, step.source))
                self._fanout[(key, step.source)] = (
                    seen if old is None else self.decay * old + (1 - self.decay) * seen)

    def forget(self, key: Hashable) -> None:
        for k in [k for k in self._fanout if k[0] == key]:
            del self._fanout[k]


POLICIES = {"adaptive": AdaptiveOrder, "fixed": FixedOrder}
