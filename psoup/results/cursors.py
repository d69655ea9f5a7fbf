"""`since` cursors: what a disconnected client saw last, so its next poll gets only the
changes (the STREAM paper's Istream and Dstream of a query's answer).

A cursor names an answer without the engine keeping a copy of it per poller. It is a
short token, `base64url(payload + mac)`:

* payload: a format version, a kind, the answer's 128-bit digest and, for a *range*
  cursor, the tupleID range [lo, hi) the answer was read from;
* mac: keyed BLAKE2b (RFC 7693's MAC mode), 128 bits, of the handle and the payload
  under the engine's secret (`cursor_secret`: a file under a durable engine's data
  directory, so cursors outlive a restart; random per in-memory engine). A garbled or
  forged cursor, or one given to another handle, fails the check and raises
  CursorInvalid, never a wrong answer.

A selection query without aggregates or history, whose window is a position range (a
time window, ROWS, or everything retained), gets range cursors: its answer is its
deterministic matches among the stream's tuples in [lo, hi)
(`Answers.answer_and_window`), so
`since` recomputes the old answer from the tuples memory still holds
(`Answers.recompute`) and checks it against the digest. Every other answer (aggregates,
joins, PARTITION BY windows, history), and a range whose tuples memory has dropped since,
is answered from a stored copy: one per distinct (handle, answer), shared by all the
pollers that got it, kept most-recently-used first within a byte budget. Only a cursor
that can be neither recomputed nor found there raises CursorExpired.

The changes are the multiset difference of the two answers' row identities:

* a selection row is its tupleID, a join row the tupleIDs of its tuples, so two equal
  rows from different tuples are different rows (bag semantics);
* an aggregated row is its group key (`Result.keys`) with its values, so a group whose
  values changed is deleted (old row) and inserted (new row), and two groups showing
  equal rows (GROUP BY columns not selected) stay two rows;
* a DISTINCT answer is a set, so its rows are their values, and a row whose first
  occurrence expired while a later duplicate remains has not changed.

Applying a poll's `deleted` and then its `inserted` rows to the previous answer, as
multisets, gives the new answer.

Identities that are numbers (tupleIDs, and the rows of a DISTINCT answer over numeric
columns) are compared as numpy columns (`row_codes`), so a poll builds no Python tuple
for them; group keys and text rows are compared as tuples.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import struct
from collections import Counter, OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from psoup import kernels
from psoup.errors import CursorExpired, CursorInvalid
from psoup.fsync import fsync_dir, write_whole
from psoup.results.result import Changes, Result, row_codes

if TYPE_CHECKING:
    from psoup.plans import Plan
    from psoup.results.answers import Answers

#: The cursor format: version, kind, answer digest, tupleID range [lo, hi). Version 3
#: replaced HMAC-SHA256 by keyed BLAKE2b (a third of the time per invocation).
VERSION = 3
_DIGEST = struct.Struct("<QQ")
_PAYLOAD = struct.Struct(">BB16sqq")
_MAC = 16
STORED, RANGE = 0, 1
#: The file under a data directory holding the cursors' MAC key.
SECRET_FILE = "cursor.key"


class CursorStore:
    """Issues cursors and answers `since` polls (see the module docstring).

    Costs: `issue` O(answer) (the digest) plus O(log n) to resolve the window; `changes`
    O(answer) to decode, recompute or look up the old answer, plus O(n log n) for the
    difference; stored copies take at most `budget` bytes (or one answer, if larger),
    shared by every poller holding the same answer.

    Args:
        answers: the engine's Answers (window ranges and recomputation).
        secret: the MAC key (`cursor_secret`), or None for a random one.
        budget: the bytes of stored answers to keep.

    Example:
        >>> from psoup.core import Core
        >>> from psoup.query import compile_statement
        >>> from psoup.stems.batch import make_batch
        >>> core = Core("partial", 64, True, "adaptive", True)
        >>> core.create(compile_statement("CREATE STREAM R (a INT)", {}), "")
        >>> core.register(compile_statement("SELECT a FROM R", core.schemas()), "h")
        >>> def put(a):
        ...     stem = core.stem("R")
        ...     core.append("R", make_batch(stem.schema, [(a,)], 1.0, 0, stem.last_ts),
        ...                 np.array([a]))
        >>> store = CursorStore(core.answers)
        >>> put(1)
        >>> c = store.issue("h", *core.answers.answer_and_window(core.plan("h"), 0.0))
        >>> put(2)
        >>> ch = store.changes("h", core.plan("h"), c,
        ...                 *core.answers.answer_and_window(core.plan("h"), 0.0))
        >>> ch.inserted.rows, ch.deleted.rows
        ([(2,)], [])
    """

    def __init__(self, answers: Answers, secret: bytes | None = None,
                 budget: int = 64 << 20):
        self.answers = answers
        self.budget = budget
        self._secret = secrets.token_bytes(32) if secret is None else secret
        self._kept: OrderedDict[tuple[str, bytes], tuple[Result, int]] = OrderedDict()
        self._by_handle: dict[str, set[bytes]] = {}
        self._bytes = 0

    @property
    def secret(self) -> bytes:
        """The MAC key (what a read replica is given, so that cursors hold on both)."""
        return self._secret

    def use_secret(self, secret: bytes) -> None:
        """Sign and check with `secret` from now on (a read replica takes its primary's
        before it issues any cursor)."""
        if len(secret) != 32:
            raise ValueError("a cursor secret is 32 bytes")
        self._secret = secret

    def issue(self, handle: str, answer: Result, window: tuple[int, int] | None,
              remember: bool = True) -> str:
        """A cursor for `answer` (the handle's current answer, and the tupleID range it
        comes from, as `Answers.answer_and_window` gives them), set on the answer too.
        The answer is stored too unless not `remember` (shared with other pollers that
        got the same one), for when it can no longer be recomputed. O(answer)."""
        digest = answer_digest(answer)
        kind, lo, hi = (STORED, 0, 0) if window is None else (RANGE, *window)
        if remember:
            self._remember(handle, digest, answer)
        payload = _PAYLOAD.pack(VERSION, kind, digest, lo, hi)
        cursor = base64.urlsafe_b64encode(payload + self._mac(handle, payload)).decode()
        answer.cursor = cursor
        return cursor

    def changes(self, handle: str, plan: Plan, since: str, answer: Result,
                window: tuple[int, int] | None) -> Changes:
        """The difference from the answer `since` stands for to `answer` (the handle's
        current answer, from the tupleID range `window`), which gets a new cursor.
        O(answer) plus O(n log n).

        Raises:
            CursorInvalid: `since` is not a cursor this engine issued for this handle.
            CursorExpired: its answer can be neither recomputed nor found.
        """
        kind, digest, lo, hi = self._decode(handle, since)
        old = None
        if kind == RANGE:
            old = self.answers.recompute(plan, lo, hi)
            if old is not None and answer_digest(old) != digest:
                old = None
        if old is None:
            kept = self._kept.get((handle, digest))
            if kept is None:
                raise CursorExpired(
                    f"cursor {since[:16]!r}... stands for an answer whose tuples have left "
                    "memory and whose stored copy was dropped (the engine keeps "
                    f"{self.budget >> 20} MiB of answers it cannot recompute, and none "
                    "across a restart); invoke without since to get the whole answer and "
                    "a new cursor")
            old = kept[0]
        inserted, deleted = difference(old, answer, plan.query.distinct)
        return Changes(answer.columns, inserted, deleted,
                       self.issue(handle, answer, window), answer.fresh_to)

    def forget(self, handle: str) -> None:
        """Drop the stored answers of an unregistered handle. O(its stored answers)."""
        for digest in self._by_handle.pop(handle, ()):
            _, size = self._kept.pop((handle, digest))
            self._bytes -= size

    def _remember(self, handle: str, digest: bytes, answer: Result) -> None:
        """Store `answer` (or mark it used), then drop the least recently used answers
        beyond the budget, always keeping the newest. O(1) amortized."""
        key = (handle, digest)
        if key in self._kept:
            self._kept.move_to_end(key)
            return
        size = _size(answer)
        self._kept[key] = (answer, size)
        self._by_handle.setdefault(handle, set()).add(digest)
        self._bytes += size
        while self._bytes > self.budget and len(self._kept) > 1:
            (old_handle, old_digest), (_, old_size) = self._kept.popitem(last=False)
            self._bytes -= old_size
            digests = self._by_handle[old_handle]
            digests.discard(old_digest)
            if not digests:
                del self._by_handle[old_handle]

    def _mac(self, handle: str, payload: bytes) -> bytes:
        return hashlib.blake2b(handle.encode() + payload, key=self._secret,
                               digest_size=_MAC).digest()

    def _decode(self, handle: str, since: object) -> tuple[int, bytes, int, int]:
        """(kind, digest, lo, hi) of a cursor issued for `handle`. O(1).

        Raises:
            CursorInvalid: anything else.
        """
        try:
            raw = base64.urlsafe_b64decode(since.encode("ascii")) if isinstance(
                since, str) else b""
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raw = b""
        payload, mac = raw[:_PAYLOAD.size], raw[_PAYLOAD.size:]
        if len(raw) != _PAYLOAD.size + _MAC or not hmac.compare_digest(
                mac, self._mac(handle, payload)):
            shown = repr(since[:16]) if isinstance(since, str) else type(since).__name__
            raise CursorInvalid(
                f"cursor {shown} was not issued by this engine for this handle: garbled, "
                "forged, given to another handle, from an older psoup or from an "
                "in-memory engine before its restart; invoke without since to get the "
                "whole answer and a new cursor")
        version, kind, digest, lo, hi = _PAYLOAD.unpack(payload)
        assert version == VERSION and kind in (STORED, RANGE), "the MAC vouches for it"
        return kind, digest, lo, hi

    def _check(self) -> None:
        """Assert the invariants (for tests): the byte count is the sum of the stored
        answers', within the budget unless one answer alone exceeds it; the per-handle
        index lists exactly the stored keys; each is stored under its own digest."""
        assert self._bytes == sum(size for _, size in self._kept.values())
        assert self._bytes <= self.budget or len(self._kept) == 1
        assert {(h, d) for h, ds in self._by_handle.items() for d in ds} == set(self._kept)
        assert all(ds for ds in self._by_handle.values())
        for (_, digest), (answer, size) in self._kept.items():
            assert answer_digest(answer) == digest and size == _size(answer)


def difference(old: Result, new: Result, distinct: bool) -> tuple[Result, Result]:
    """(inserted, deleted): the rows of `new` beyond `old` and those of `old` beyond
    `new`, as multisets of row identities (see the module docstring). O(n log n).

    Example:
        >>> old = Result(["a"], [(1,), (2,)], np.array([1.0, 2.0]), np.array([10, 11]))
        >>> new = Result(["a"], [(2,), (3,)], np.array([2.0, 3.0]), np.array([11, 12]))
        >>> [part.rows for part in difference(old, new, distinct=False)]
        [[(3,)], [(1,)]]
    """
    if distinct:
        entered, left = _differ_columns(new.values, old.values) or _differ(new.rows, old.rows)
    elif new.keys is not None:               # an aggregated answer: by group and row
        entered, left = _differ(list(zip(new.keys, new.rows, strict=True)),
                                list(zip(old.keys or [], old.rows, strict=True)))
    elif new.tuple_ids.ndim == 2:            # a join: one tupleID per FROM item
        differed = _differ_columns(list(new.tuple_ids.T), list(old.tuple_ids.T))
        assert differed is not None, "tupleIDs are int64 columns"
        entered, left = differed
    else:                                    # tupleIDs are unique in an answer
        entered = ~np.isin(new.tuple_ids, old.tuple_ids)
        left = ~np.isin(old.tuple_ids, new.tuple_ids)
    return new.take(entered), old.take(left)


def answer_digest(answer: Result) -> bytes:
    """128 bits that tell answers apart: their tupleIDs (which fix a selection's or a
    join's rows, DISTINCT ones included) and, for answers made of rows (aggregates),
    their group keys and rows. O(answer).

    Example:
        >>> a = Result(["a"], [(1,)], np.array([5.0]), np.array([3]))
        >>> answer_digest(a) == answer_digest(a.take(np.array([True]))), len(answer_digest(a))
        (True, 16)
    """
    ids = answer.tuple_ids
    # a compiled pass: blake2b over the tupleIDs' bytes took as long as fetching the
    # answer (0.44 of 1.4 ms, 38K rows); the lanes fold in the count, the shape's width
    # is folded here (a join's tupleIDs are one column per FROM item)
    s, x = kernels.fingerprint(ids if ids.dtype == np.int64 else ids.astype(np.int64))
    lanes = _DIGEST.pack(int(s), int(x) ^ (ids.shape[1] if ids.ndim == 2 else 0))
    if answer.values is not None:
        return lanes
    return hashlib.blake2b(lanes + repr((answer.keys, answer.rows)).encode(),
                           digest_size=16).digest()


def _size(answer: Result) -> int:
    """The bytes a stored answer holds, roughly: its arrays, and 64 bytes per value of
    an answer made of rows. O(columns)."""
    size = answer.ts.nbytes + answer.tuple_ids.nbytes
    if answer.values is not None:
        return size + sum(v.nbytes + (56 * len(v) if v.dtype == object else 0)
                          for v in answer.values)
    return size + 64 * len(answer) * (len(answer.columns) + 1)


def cursor_secret(directory: str | os.PathLike[str]) -> bytes:
    """The MAC key of the cursors of the engine whose data directory is `directory`:
    read from its `cursor.key`, made (owner-only, written whole and fsync'ed) when
    missing or unreadable. O(1).
    """
    path = Path(directory) / SECRET_FILE
    try:
        secret = path.read_bytes()
    except FileNotFoundError:
        secret = b""
    if len(secret) == 32:
        return secret
    secret = secrets.token_bytes(32)
    write_whole(path, lambda f: f.write(secret), private=True)
    fsync_dir(path.parent)
    return secret


def _differ(new: list[Any], old: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The multiset difference of two lists of row identities, as masks: of the rows of
    `new` beyond their identity's count in `old` (the last ones of each identity), and of
    the rows of `old` beyond its count in `new`. O(n + m).

    Example:
        >>> [m.tolist() for m in _differ(["a", "b", "a"], ["a", "c"])]
        [[False, True, True], [False, True]]
    """
    def beyond(rows: list[Any], other: list[Any]) -> np.ndarray:
        budget = Counter(other)
        mask = np.empty(len(rows), dtype=bool)
        for i, key in enumerate(rows):
            left = budget[key]
            mask[i] = not left
            budget[key] = left - 1 if left else 0
        return mask
    return beyond(new, old), beyond(old, new)


def _differ_columns(new: list[np.ndarray] | None,
                    old: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """`_differ` for identities that are rows of numeric columns, without a Python object
    per row; None when either side has a column that is not numeric. O((n + m) log(n + m)).

    Example:
        >>> [m.tolist() for m in _differ_columns([np.array([1, 2, 1])], [np.array([1, 3])])]
        [[False, True, True], [False, True]]
    """
    if new is None or old is None or len(new) != len(old) or any(
            a.dtype != b.dtype for a, b in zip(new, old, strict=True)):
        return None
    grouped = row_codes([np.concatenate([a, b]) for a, b in zip(new, old, strict=True)])
    if grouped is None:
        return None
    first, codes = grouped
    n = len(new[0]) if new else 0
    return _beyond(codes[:n], codes[n:], len(first)), _beyond(codes[n:], codes[:n], len(first))


def _beyond(rows: np.ndarray, other: np.ndarray, ncodes: int) -> np.ndarray:
    """The rows (codes) beyond their code's count in `other`: the k-th occurrence of a code
    (from 0, in row order) is beyond when k >= its count in `other`, as in `_differ`."""
    budget = np.bincount(other, minlength=ncodes)
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    rank = np.arange(len(rows)) - np.searchsorted(ordered, ordered, side="left")
    mask = np.empty(len(rows), dtype=bool)
    mask[order] = rank >= budget[ordered]
    return mask
