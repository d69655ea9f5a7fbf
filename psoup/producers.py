"""Idempotent producers: a retried insert batch is applied once (docs/api.md, "Retries").

A producer (a `psoup.Client`, a `psoup ingest`) names itself with a producer id and numbers
its batches 0, 1, 2, ... (Kafka's idempotent producer works the same way). When the
connection breaks after a batch was sent, the producer cannot know whether it was applied;
it sends the same (producer, seq) again, and the engine answers from this table instead of
applying it twice.

The rule, per producer, with `last` the last applied seq (-1 for a producer never seen):

* seq == last + 1 is applied and becomes `last`;
* seq in (last - REMEMBERED, last] is a duplicate: answered with the tupleIDs it got the
  first time, nothing changes (a pipelining client may have that many batches in doubt);
* anything else raises SequenceError naming the producer, the expected seq and the seq
  received, and nothing changes.

The table holds at most `max_producers` producers; beyond that the one idle longest is
forgotten, and a forgotten producer counts as never seen (it must start again at 0; any
other seq is refused, never applied twice). The engine logs each keyed batch with its key
and checkpoints the table, so it survives restarts.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from psoup.errors import SequenceError

#: Batches per producer whose tupleIDs are kept to answer a duplicate.
REMEMBERED = 16


class ProducerTable:
    """Per producer: its last REMEMBERED batches as (seq, first tupleID, rows), newest
    last, in an LRU order of producers.

    Example:
        >>> t = ProducerTable(max_producers=2)
        >>> t.check("p", 0) is None
        True
        >>> t.record("p", 0, 10, 3)
        >>> t.check("p", 0).tolist()
        [10, 11, 12]
        >>> t.last("p")
        0
    """

    def __init__(self, max_producers: int = 10_000):
        if max_producers < 1:
            raise ValueError("max_producers must be positive")
        self.max_producers = max_producers
        self._table: OrderedDict[str, deque[tuple[int, int, int]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def last(self, producer: str) -> int:
        """The producer's last applied seq; -1 for a producer this table does not hold."""
        batches = self._table.get(producer)
        return batches[-1][0] if batches else -1

    def batch(self, producer: str, seq: int) -> np.ndarray | None:
        """The tupleIDs of the producer's batch `seq`, if remembered. O(REMEMBERED)."""
        for s, first, n in self._table.get(producer, ()):
            if s == seq:
                return np.arange(first, first + n, dtype=np.int64)
        return None

    def check(self, producer: str, seq: int) -> np.ndarray | None:
        """None when (producer, seq) is the producer's next batch; the first answer's
        tupleIDs when it is a duplicate. O(REMEMBERED).

        Raises:
            SequenceError: a gap, or a seq older than what is remembered.
        """
        last = self.last(producer)
        if seq == last + 1:
            return None
        if last - REMEMBERED < seq <= last:
            found = self.batch(producer, seq)
            if found is not None:
                return found
        raise SequenceError(f"producer {producer!r}: expected seq {last + 1}, got {seq} "
                            f"(a retry may repeat one of the last {REMEMBERED} batches; "
                            "nothing was applied)")

    def record(self, producer: str, seq: int, first: int, n: int) -> None:
        """Remember that batch `seq` got tupleIDs first..first+n-1; evicts the producer
        idle longest beyond max_producers. O(1)."""
        batches = self._table.get(producer)
        if batches is None:
            batches = self._table[producer] = deque(maxlen=REMEMBERED)
        batches.append((int(seq), int(first), int(n)))
        self._table.move_to_end(producer)
        while len(self._table) > self.max_producers:
            self._table.popitem(last=False)

    def image(self) -> list[list[Any]]:
        """The table as msgpack values, idle longest first (for a checkpoint)."""
        return [[p, [list(b) for b in batches]] for p, batches in self._table.items()]

    def restore(self, image: Iterable[list[Any]]) -> None:
        """Load what `image` wrote (recovery)."""
        for producer, batches in image:
            for seq, first, n in batches:
                self.record(producer, seq, first, n)

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def _check(self) -> None:
        """Assert the invariants (for tests): at most max_producers producers, each with
        at most REMEMBERED batches of consecutive seqs whose tupleIDs increase."""
        assert len(self._table) <= self.max_producers
        for producer, batches in self._table.items():
            assert 0 < len(batches) <= REMEMBERED, producer
            seqs = [s for s, _, _ in batches]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (producer, seqs)
            ends = [(first, first + n) for _, first, n in batches]
            assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False)), (producer, ends)
