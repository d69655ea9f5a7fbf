"""Groups of join queries that share a FROM list: composite tuples across queries
(PSoup Sect. 5.4, "single data, multiple queries").

Join queries over the same streams, in the same FROM order, with the same join factors
differ only in their local factors (and in windows and output, which apply at
invocation). They form one group, with one join Results Structure (psoup.results.joins)
in which each entry has a bit per member. A member query is a bit *index* in the group.

For each FROM item the group keeps its *candidates*: the retained positions that pass
at least one member's local factors, each with the bitmap row of the members it passes.
A new batch's Query SteM probe already tells which new tuples pass which member's local
factors; those become the new hybrid structs, with their member bits, and they probe the
other items' candidates *once for the whole group*: the join factors, shared by every
member, are applied once per combination instead of once per member. A combination's
members are the AND of its tuples' member bits; combinations no member wants are
dropped. With one member a group is exactly the per-query join of Fig. 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

from psoup.query.model import Query

WORD = 64


def group_key(query: Query) -> Hashable:
    """What members of one group share: the streams in FROM order and the set of join
    factors (in whatever order the WHERE clause lists them)."""
    factors = sorted(set(query.joins), key=lambda f: (f.left, f.right, f.left_column,
                                                      f.right_column, f.op, f.offset,
                                                      f.left_offset))
    return tuple(s.stream for s in query.sources), tuple(factors)


def member_bits(probe: np.ndarray, slots: list[int], words: int) -> np.ndarray:
    """Regroup a Query SteM probe's bitmap (n, W) by member: bit g of row i of the
    result is bit `slots[g]` of row i of `probe`. A few members are moved bit by bit;
    many at once by unpacking the probe's rows: O(n * W * 64 / 8).

    Example:
        >>> member_bits(np.array([[0b100], [0b010]], dtype="<u8"), [2, 1], 1)[:, 0].tolist()
        [1, 2]
    """
    n = probe.shape[0]
    if len(slots) <= 16:
        out = np.zeros((n, words), dtype="<u8")
        for g, slot in enumerate(slots):
            word, bit = divmod(slot, WORD)
            if word < probe.shape[1]:
                column = (probe[:, word] >> np.uint64(bit)) & np.uint64(1)
                out[:, g // WORD] |= column << np.uint64(g % WORD)
        return out
    flags = np.unpackbits(np.ascontiguousarray(probe).view(np.uint8), axis=1,
                          bitorder="little")
    flags = flags[:, np.minimum(slots, flags.shape[1] - 1)]
    flags[:, np.asarray(slots) >= probe.shape[1] * WORD] = 0
    packed = np.packbits(flags, axis=1, bitorder="little")
    out = np.zeros((n, words * 8), dtype=np.uint8)
    out[:, :packed.shape[1]] = packed
    return out.view("<u8")


class Candidates:
    """One FROM item's retained positions that pass some member's local factors, sorted,
    with a row of member bits each.

    Example:
        >>> c = Candidates()
        >>> c.append(np.array([3, 5]), np.array([[1], [1]], dtype="<u8"))
        >>> c.merge(np.array([4, 5]), 1)
        >>> c.positions.tolist(), c.bits[:, 0].tolist()
        ([3, 4, 5], [1, 2, 3])
    """

    def __init__(self):
        self.positions = np.empty(0, np.int64)
        self.bits = np.empty((0, 1), dtype="<u8")

    def _widen(self, words: int) -> None:
        if self.bits.shape[1] < words:
            self.bits = np.pad(self.bits, ((0, 0), (0, words - self.bits.shape[1])))

    def append(self, positions: np.ndarray, bits: np.ndarray) -> None:
        """New tuples (positions beyond every stored one) with their member bits."""
        if not len(positions):
            return
        self._widen(bits.shape[1])
        if bits.shape[1] < self.bits.shape[1]:
            bits = np.pad(bits, ((0, 0), (0, self.bits.shape[1] - bits.shape[1])))
        self.positions = np.concatenate([self.positions, positions])
        self.bits = np.concatenate([self.bits, bits])

    def merge(self, positions: np.ndarray, index: int) -> None:
        """A new member passes at `positions` (sorted): set its bit there. O(n)."""
        word, bit = divmod(index, WORD)
        self._widen(word + 1)
        union = np.union1d(self.positions, positions)
        if len(union) != len(self.positions):
            bits = np.zeros((len(union), self.bits.shape[1]), dtype="<u8")
            bits[np.searchsorted(union, self.positions)] = self.bits
            self.positions, self.bits = union, bits
        rows = np.searchsorted(self.positions, positions)
        self.bits[rows, word] |= np.uint64(1) << np.uint64(bit)

    def clear(self, index: int) -> None:
        """A member left; rows no member wants go."""
        word, bit = divmod(index, WORD)
        if word < self.bits.shape[1]:
            self.bits[:, word] &= ~(np.uint64(1) << np.uint64(bit))
            keep = self.bits.any(axis=1)
            if not keep.all():
                self.positions, self.bits = self.positions[keep], self.bits[keep]

    def expire(self, horizon: int) -> None:
        cut = int(np.searchsorted(self.positions, horizon))
        if cut:
            self.positions, self.bits = self.positions[cut:], self.bits[cut:]

    def between(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = np.searchsorted(self.positions, (lo, hi))
        return self.positions[a:b], self.bits[a:b]

    def nbytes(self) -> int:
        return self.positions.nbytes + self.bits.nbytes


@dataclass
class JoinGroup:
    """Join queries sharing streams and join factors; `query` is the first member's
    (its sources' streams and its join factors are everyone's)."""

    gid: int
    query: Query
    members: dict[int, int] = field(default_factory=dict)    # jid -> bit index
    slots: dict[int, tuple[int, ...]] = field(default_factory=dict)   # jid -> local slots
    candidates: list[Candidates] = field(default_factory=list)

    def __post_init__(self):
        if not self.candidates:
            self.candidates = [Candidates() for _ in self.query.sources]

    @property
    def words(self) -> int:
        return max(self.members.values(), default=0) // WORD + 1

    def join(self, jid: int, slots: tuple[int, ...]) -> int:
        """Add a member; returns its bit index (the lowest free one)."""
        taken = set(self.members.values())
        index = next(i for i in range(len(taken) + 1) if i not in taken)
        self.members[jid] = index
        self.slots[jid] = slots
        return index

    def leave(self, jid: int) -> int:
        index = self.members.pop(jid)
        del self.slots[jid]
        for cands in self.candidates:
            cands.clear(index)
        return index

    def item_bits(self, probe: np.ndarray, item: int) -> np.ndarray:
        """Each probed tuple's member bits for FROM item `item` (its local factors)."""
        by_index = sorted((index, self.slots[jid][item]) for jid, index in self.members.items())
        slots = [0] * (by_index[-1][0] + 1)
        present = np.zeros(len(slots), dtype=bool)
        for index, slot in by_index:
            slots[index] = slot
            present[index] = True
        bits = member_bits(probe, slots, self.words)
        if not present.all():                  # free indices read some slot: clear them
            for index in np.flatnonzero(~present).tolist():
                word, bit = divmod(index, WORD)
                bits[:, word] &= ~(np.uint64(1) << np.uint64(bit))
        return bits

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.candidates)
