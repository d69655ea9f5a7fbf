"""Groups of join queries that share a FROM list: composite tuples across queries
(PSoup Sect. 5.4, "single data, multiple queries"), one Results Structure per group.

Join queries over the same streams, in the same FROM order, with the same join factors
differ only in their local factors (and in windows and output, which apply at
invocation). They form one group, whose entries (psoup.results.joins) carry a bit per
member. A member query is a bit *index* in the group.

For each FROM item the group keeps its *candidates*: the retained positions that pass
at least one member's local factors, each with the bitmap row of the members it passes.
A new batch's Query SteM probe already tells which new tuples pass which member's local
factors (each member files one local query per FROM item); those become the new hybrid
structs, with their member bits, and they probe the other items' candidates *once for the
whole group*: the join factors, shared by every member, are applied once per combination
instead of once per member. A combination's members are the AND of its tuples' member
bits; combinations no member wants are dropped. With one member a group is exactly the
per-query join of Fig. 5.

A group is a Sink attached to its members' local slots. It stores; the joining itself --
hybrid structs in the routing policy's order -- is the eddy's, handed in as a `Joiner`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from psoup.bits import WORD, bit_of, regroup, set_bit, widened
from psoup.plans import JoinPlan
from psoup.query.model import Query
from psoup.results.base import Sink
from psoup.results.joins import Combinations, JoinEntries, in_windows, stamped
from psoup.stems.data_stem import DataSteM
from psoup.stems.span import Span


class Joiner(Protocol):
    """What a group asks of the router: join candidate positions through hybrid structs
    (an (m, k) array of combinations in FROM order), learning fan-outs under `key`."""

    def join(self, key: Hashable, query: Query, stems: Sequence[DataSteM],
             candidates: Mapping[int, np.ndarray], first: int | None) -> np.ndarray: ...

    def forget(self, key: Hashable) -> None: ...


def group_key(query: Query) -> Hashable:
    """What members of one group share: the streams in FROM order and the set of join
    factors (in whatever order the WHERE clause lists them)."""
    factors = sorted(set(query.joins), key=lambda f: (f.left, f.right, f.left_column,
                                                      f.right_column, f.op, f.offset,
                                                      f.left_offset))
    return tuple(s.stream for s in query.sources), tuple(factors)


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

    def __init__(self) -> None:
        self.positions = np.empty(0, np.int64)
        self.bits = np.empty((0, 1), dtype="<u8")

    def append(self, positions: np.ndarray, bits: np.ndarray) -> None:
        """New tuples (positions beyond every stored one) with their member bits."""
        if not len(positions):
            return
        words = max(bits.shape[1], self.bits.shape[1])
        self.bits = widened(self.bits, words)
        self.positions = np.concatenate([self.positions, positions])
        self.bits = np.concatenate([self.bits, widened(bits, words)])

    def merge(self, positions: np.ndarray, index: int) -> None:
        """A new member passes at `positions` (sorted): set its bit there. O(n)."""
        self.bits = widened(self.bits, index // WORD + 1)
        union = np.union1d(self.positions, positions)
        if len(union) != len(self.positions):
            bits = np.zeros((len(union), self.bits.shape[1]), dtype="<u8")
            bits[np.searchsorted(union, self.positions)] = self.bits
            self.positions, self.bits = union, bits
        rows = np.searchsorted(self.positions, positions)
        word, mask = bit_of(index)
        self.bits[rows, word] |= mask

    def clear(self, index: int) -> None:
        """A member left; rows no member wants go."""
        if index // WORD < self.bits.shape[1]:
            set_bit(self.bits, index, False)
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

    def _check(self) -> None:
        assert (np.diff(self.positions) > 0).all(), "candidates are sorted and distinct"
        assert len(self.positions) == len(self.bits) and self.bits.any(axis=1).all()


class JoinGroup(Sink):
    """Join queries sharing streams and join factors, with their candidates and their
    entries; `query` is the first member's (its sources' streams and its join factors
    are everyone's).

    Events: a member's local slot registers with its item's matching positions (once all
    of a member's items have, the member's own combinations over the retained data are
    joined: Fig. 4); a batch on one of the group's streams is joined for every member at
    once (Fig. 5); a member's first local slot to unregister removes it.
    """

    def __init__(self, gid: int, query: Query, stems: Sequence[DataSteM], joiner: Joiner,
                 eager: bool = False):
        self.gid = gid
        self.query = query
        self.stems = list(stems)
        self.joiner = joiner
        self.members: dict[int, int] = {}                 # jid -> bit index
        self.plans: dict[int, JoinPlan] = {}              # jid -> its plan
        self.candidates = [Candidates() for _ in query.sources]
        self.entries = JoinEntries(eager)
        self._slot_item: dict[int, tuple[int, int]] = {}  # local slot -> (jid, item)
        self._pending: dict[int, dict[int, np.ndarray]] = {}

    @property
    def words(self) -> int:
        return max(self.members.values(), default=0) // WORD + 1

    @property
    def empty(self) -> bool:
        return not self.members

    def join(self, plan: JoinPlan) -> int:
        """Add a member; returns its bit index (the lowest free one)."""
        taken = set(self.members.values())
        index = next(i for i in range(len(taken) + 1) if i not in taken)
        self.members[plan.jid] = index
        self.plans[plan.jid] = plan
        for item, slot in enumerate(plan.slots):
            self._slot_item[slot] = (plan.jid, item)
        return index

    # ------------------------------------------------------------------ events

    def on_register(self, slot: int, stream: str, positions: np.ndarray) -> None:
        """One item of a new member: its local matches join the candidates; once every
        item has come, the member's combinations over the retained data (Fig. 4)."""
        jid, item = self._slot_item[slot]
        index = self.members[jid]
        stem = self.stems[item]
        self.candidates[item].expire(stem.horizon)
        self.candidates[item].merge(positions, index)
        pending = self._pending.setdefault(jid, {})
        pending[item] = positions
        if len(pending) < len(self.query.sources):
            return
        del self._pending[jid]
        plan = self.plans[jid]
        combos = stamped(self.joiner.join(jid, plan.query, self.stems, pending, None),
                         self.stems)
        combos.bits = np.zeros((len(combos), index // WORD + 1), dtype="<u8")
        set_bit(combos.bits, index)
        self.entries.add(combos, self.stems)

    def on_insert(self, stream: str, p0: int, bits: np.ndarray,
                  batch: Mapping[str, np.ndarray]) -> None:
        """New tuples of one stream joined with the stored data (Fig. 5), once for every
        member of the group: the new tuples that pass some member's local factors probe
        the other items' candidates together, and each combination keeps the members
        all its tuples pass. For a stream that several FROM items read (a self-join),
        each combination with at least one new tuple is produced once: when item i
        takes a new tuple, the items before it on the same stream take only old ones."""
        stems, sources = self.stems, self.query.sources
        new = {}
        for i, source in enumerate(sources):
            if source.stream != stream:
                continue
            item_bits = self._item_bits(bits, i)
            rows = np.flatnonzero(item_bits.any(axis=1))
            positions = p0 + rows
            keep = positions >= stems[i].horizon       # a batch longer than retention
            new[i] = (positions[keep], item_bits[rows[keep]])
            self.candidates[i].expire(stems[i].horizon)
            self.candidates[i].append(*new[i])
        found, found_bits = [], []
        for i, (positions, item_bits) in new.items():
            if not len(positions):
                continue
            candidates, members = {i: positions}, {i: item_bits}
            for j, other in enumerate(sources):
                if j != i:
                    end = p0 if (other.stream == stream and j < i) else stems[j].n
                    candidates[j], members[j] = self.candidates[j].between(stems[j].horizon,
                                                                           end)
            combos = self.joiner.join(("group", self.gid), self.query, stems, candidates, i)
            if not len(combos):
                continue
            words = min(b.shape[1] for b in members.values())
            wanted = np.full((len(combos), words), ~np.uint64(0), dtype="<u8")
            for j, cands in candidates.items():
                wanted &= members[j][np.searchsorted(cands, combos[:, j]), :words]
            wanted_by_some = wanted.any(axis=1)
            found.append(combos[wanted_by_some])
            found_bits.append(wanted[wanted_by_some])
        if found:
            entries = stamped(np.concatenate(found), stems)
            if len(entries):
                entries.bits = np.concatenate(found_bits)
                self.entries.add(entries, stems)

    def on_expire(self, stream: str, horizon: int) -> None:
        for i, source in enumerate(self.query.sources):
            if source.stream == stream:
                self.candidates[i].expire(horizon)

    def on_unregister(self, slot: int) -> None:
        """A member's local slot: the first of them to go removes the member, whose
        bit index is then cleared everywhere for reuse."""
        owner = self._slot_item.pop(slot, None)
        if owner is None or owner[0] not in self.members:
            return
        jid = owner[0]
        index = self.members.pop(jid)
        self.plans.pop(jid)
        self._pending.pop(jid, None)
        self.joiner.forget(jid)
        for cands in self.candidates:
            cands.clear(index)
        if self.members:
            self.entries.clear(index)
        else:
            self.entries = JoinEntries(self.entries.eager)
            self.joiner.forget(("group", self.gid))

    # ------------------------------------------------------------------ reads

    def matches(self, jid: int, spans: Sequence[Span]) -> Combinations:
        """Member `jid`'s combinations whose every tuple lies in its item's span."""
        entries = self.entries.member(self.members[jid], self.stems)
        return in_windows(entries, spans, self.stems)

    def nbytes(self) -> int:
        return self.entries.nbytes() + sum(c.nbytes() for c in self.candidates)

    def stats(self) -> dict[str, Any]:
        """Introspection: the streams, the members and the live entries."""
        return {"streams": [s.stream for s in self.query.sources],
                "members": len(self.members), "entries": len(self.entries.entries(self.stems))}

    def _item_bits(self, probe: np.ndarray, item: int) -> np.ndarray:
        """Each probed tuple's member bits for FROM item `item` (its local factors)."""
        by_index = sorted((index, self.plans[jid].slots[item])
                          for jid, index in self.members.items())
        slots = [0] * (by_index[-1][0] + 1)
        present = np.zeros(len(slots), dtype=bool)
        for index, slot in by_index:
            slots[index] = slot
            present[index] = True
        bits = regroup(probe, slots, self.words)
        for index in np.flatnonzero(~present).tolist():    # free indices read some slot
            set_bit(bits, index, False)
        return bits

    def _check(self) -> None:
        """Assert the structure's invariants (for tests)."""
        assert len(set(self.members.values())) == len(self.members), "indices are distinct"
        assert set(self.plans) == set(self.members)
        for cands in self.candidates:
            cands._check()
            live = cands.bits
            for index in range(live.shape[1] * WORD):
                if index not in self.members.values() and index // WORD < live.shape[1]:
                    word, mask = bit_of(index)
                    assert not (live[:, word] & mask).any(), "a free index has no bits"


class JoinGroups:
    """The join groups of one engine: the group of each join query, created with its
    first member and dropped with its last. With `shared=False` every query is its own
    group (for comparison: one join per query per batch); `eager` entries are ordered as
    they arrive (PSoup-C), else at the next read (PSoup-P)."""

    def __init__(self, joiner: Joiner, shared: bool = True, eager: bool = False):
        self.joiner = joiner
        self.shared = shared
        self.eager = eager
        self._by_key: dict[Hashable, JoinGroup] = {}
        self._of: dict[int, JoinGroup] = {}
        self._next_gid = 0

    def add(self, plan: JoinPlan, stems: Sequence[DataSteM]) -> JoinGroup:
        """The group `plan` joins (a new one if none shares its FROM list and joins)."""
        key = group_key(plan.query) if self.shared else ("query", plan.jid)
        group = self._by_key.get(key)
        if group is None or group.empty:
            group = self._by_key[key] = JoinGroup(self._next_gid, plan.query, stems,
                                                  self.joiner, self.eager)
            self._next_gid += 1
        group.join(plan)
        self._of[plan.jid] = group
        return group

    def of(self, jid: int) -> JoinGroup:
        return self._of[jid]

    def __contains__(self, jid: int) -> bool:
        return jid in self._of

    def remove(self, jid: int) -> None:
        """Forget the group of a member that left; a group left empty goes too."""
        group = self._of.pop(jid, None)
        if group is not None and group.empty:
            self._by_key = {k: g for k, g in self._by_key.items() if g is not group}

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[JoinGroup]:
        return iter(self._by_key.values())

    def nbytes(self) -> int:
        return sum(group.nbytes() for group in self._by_key.values())
