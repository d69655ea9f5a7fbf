"""Hybrid structs: joining a query's FROM items through the Data SteMs (PSoup Sect.
3.2.2-3.2.3, Figs. 4 and 5; composite tuples, Sect. 5.4).

A hybrid struct is a partial combination (one tuple from each FROM item joined so far)
together with what is left of the query once those tuples' values are substituted into
the join factors. Here the structs of one step travel together, as arrays: a
*composite* in the paper's sense. The factors local to each FROM item (evaluated once, by
the Query SteM or the Data SteM probe) give each item's candidate positions; the
partial combinations then probe the next item's candidates in one step:

* an equality factor drives a sort-merge join: the candidates are sorted by the join
  column once, and each struct finds its matches by binary search (Fig. 11's sort-merge
  of predicates with data);
* an inequality factor drives an index nested-loops join over the same sorted column:
  each struct's matches are one contiguous range;
* the other factors between the new item and those already joined filter the expanded
  structs, vectorized.

No intermediate table is stored: a step's output is the next step's input, and the last
step's output is a set of complete combinations for the Results Structure.

`separate_probe` is the paper's baseline without composite tuples: every hybrid struct
probes the next Data SteM on its own (Fig. 11, "Separate").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from psoup.query.model import CompareOp, JoinFactor, Query, Source
from psoup.query.normalize import FLIPPED
from psoup.stems.data_stem import DataSteM
from psoup.stems.predicates import HOLDS_BEYOND, as_double, compare, shifted

#: What `y rel t` must hold for the candidate value y when the join factor is seen from
#: its right side (x op y + c  <=>  y flip(op) x - c).


@dataclass
class Step:
    """What one join step saw, for the routing policy: structs in, combinations out."""

    source: int
    structs_in: int
    candidates: int
    structs_out: int


@dataclass(frozen=True)
class Link:
    """A join factor seen from source `new`'s side: `y + y_offset rel x + x_offset`, y
    the new source's `column`, x the other source's `other_column` (the comparison as
    written, mirrored when the new source is on its right)."""

    other: int
    other_column: str
    column: str
    rel: CompareOp
    x_offset: int | float
    y_offset: int | float

    def holds(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Which aligned pairs satisfy the factor (exactly: predicates.compare)."""
        return compare(self.rel, y, x, self.x_offset, self.y_offset)

    def keys(self, y_sorted: np.ndarray, x: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(ykeys, targets, above, below) such that `y rel x` for the pair (y_sorted[i],
        x[j]) is `ykeys[i] rel targets[j]`, with ykeys still sorted, except where
        `above`/`below` mark an x whose exact target left the int64 range (INT only).
        Between INT columns the offsets fold into the target exactly; with a FLOAT
        involved both sides are doubles as written, and y + c stays sorted because
        rounding is monotone."""
        if y_sorted.dtype.kind == "i" and x.dtype.kind == "i":
            target, above, below = shifted(x, int(self.x_offset) - int(self.y_offset))
            return y_sorted, target, above, below
        if "f" in y_sorted.dtype.kind + x.dtype.kind:
            return as_double(y_sorted, self.y_offset), as_double(x, self.x_offset), None, None
        return y_sorted, x, None, None


def oriented(factor: JoinFactor, new: int) -> Link:
    """The factor as a condition on source `new`'s column given the other source's."""
    if factor.left == new:       # y + c1 op x + c2
        return Link(factor.right, factor.right_column, factor.left_column, factor.op,
                    factor.offset, factor.left_offset)
    return Link(factor.left, factor.left_column, factor.right_column, FLIPPED[factor.op],
                factor.left_offset, factor.offset)


def _pairs(link: Link | None, stem: DataSteM, cand: np.ndarray, structs: int,
           aligned: Callable[[int, str], np.ndarray]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One join step's pairs: for each pair, the struct it extends (`left`) and the new
    item's candidate position (`right`), with the new item's values of the driving link
    aligned to them; a cross product when no link drives (`link` None). O(structs +
    candidates log candidates + pairs)."""
    if link is None:
        left = np.repeat(np.arange(structs), len(cand))
        return left, np.tile(cand, structs), np.empty(0)
    y = stem.column(link.column, cand)
    by = np.argsort(y, kind="stable")
    y_sorted, cand_sorted = y[by], cand[by]
    ykeys, target, above, below = link.keys(y_sorted, aligned(link.other, link.other_column))
    lo, hi = _ranges(ykeys, target, link.rel)
    for beyond, holds in ((above, HOLDS_BEYOND[link.rel][0]),
                          (below, HOLDS_BEYOND[link.rel][1])):
        if beyond is not None and beyond.any():     # x's target left int64
            lo[beyond] = 0
            hi[beyond] = len(y_sorted) if holds else 0
    counts = np.maximum(hi - lo, 0)
    left = np.repeat(np.arange(structs), counts)
    starts = np.repeat(lo - np.cumsum(counts) + counts, counts)
    at = starts + np.arange(len(left))
    return left, cand_sorted[at], y_sorted[at]


def _keep(combo: dict[int, np.ndarray], values: dict[tuple[int, str], np.ndarray],
          keep: np.ndarray) -> None:
    """Keep the structs (and their aligned values) where `keep` holds."""
    for key in values:
        values[key] = values[key][keep]
    for source in combo:
        combo[source] = combo[source][keep]


def join(query: Query, stems: Sequence[DataSteM], candidates: Mapping[int, np.ndarray],
         order: Sequence[int], steps: list[Step] | None = None) -> np.ndarray:
    """Every combination of candidate positions (one per FROM item) that satisfies the
    query's join factors, as an (m, k) int64 array in FROM order.

    Args:
        query: the join query.
        stems: the Data SteM of each FROM item, in FROM order.
        candidates: per FROM item, the sorted positions satisfying its local factors.
        order: the order in which items are joined (the routing policy's choice); the
            first item's candidates are the initial structs.
        steps: when given, one Step per join step is appended (for the policy).

    Example:
        >>> from psoup.query.model import StreamSchema, Window
        >>> from psoup.stems.batch import make_batch
        >>> r = DataSteM(StreamSchema("R", (("a", "int"),)))
        >>> _ = r.append(make_batch(r.schema, [(1,), (5,)], 1.0, 0, r.last_ts), np.arange(2))
        >>> s = DataSteM(StreamSchema("S", (("b", "int"),)))
        >>> _ = s.append(make_batch(s.schema, [(3,), (0,)], 1.0, 0, s.last_ts), np.arange(2, 4))
        >>> q = Query("", (Source("R", "R", Window()), Source("S", "S", Window())), (),
        ...           joins=(JoinFactor(0, "a", ">", 1, "b"),))
        >>> sorted(map(tuple, join(q, [r, s], {0: np.array([0, 1]), 1: np.array([0, 1])},
        ...                        [0, 1]).tolist()))
        [(0, 1), (1, 0), (1, 1)]
    """
    k = len(query.sources)
    first = order[0]
    combo: dict[int, np.ndarray] = {first: np.asarray(candidates[first], dtype=np.int64)}
    values: dict[tuple[int, str], np.ndarray] = {}   # (source, column) -> aligned values

    def aligned(source: int, column: str) -> np.ndarray:
        got = values.get((source, column))
        if got is None:
            got = values[(source, column)] = stems[source].column(column, combo[source],
                                                                    any_order=True)
        return got

    for new in order[1:]:
        structs = len(next(iter(combo.values())))
        cand = np.asarray(candidates[new], dtype=np.int64)
        if structs == 0 or len(cand) == 0:
            return np.empty((0, k), dtype=np.int64)
        links = [oriented(f, new) for f in query.joins
                 if (f.left == new and f.right in combo) or (f.right == new and f.left in combo)]
        driver = _driver(links)
        link = None if driver is None else links.pop(driver)
        left, right, y = _pairs(link, stems[new], cand, structs, aligned)
        if link is not None:
            values[(new, link.column)] = y
        for key in list(values):
            if key[0] != new:
                values[key] = values[key][left]
        for source in combo:
            combo[source] = combo[source][left]
        combo[new] = right
        for link in links:
            _keep(combo, values,
                  link.holds(aligned(new, link.column), aligned(link.other, link.other_column)))
        if steps is not None:
            steps.append(Step(new, structs, len(cand), len(combo[new])))
    return np.column_stack([combo[s] for s in range(k)]) if k else np.empty((0, 0), np.int64)


def separate_probe(query: Query, stems: Sequence[DataSteM], outer: int,
                   outer_positions: np.ndarray, inner: int, inner_source: Source) -> np.ndarray:
    """Fig. 11's "Separate" baseline for a two-way join: each hybrid struct (one outer
    tuple with its values substituted into the join factors) probes the inner Data SteM
    on its own, with the inner item's local factors and its own join factors. Returns
    the (m, 2) combinations, like `join`. O(structs * probe)."""
    links = [oriented(f, inner) for f in query.joins]
    outer_values = {link.other_column: stems[outer].column(link.other_column,
                                                              outer_positions)
                    for link in links}
    stem = stems[inner]
    out = []
    for i, p in enumerate(outer_positions.tolist()):
        mask_positions = stem.probe(inner_source)
        if len(mask_positions) == 0:
            continue
        keep = np.ones(len(mask_positions), dtype=bool)
        for link in links:
            y = stem.column(link.column, mask_positions)
            x = np.full(len(y), outer_values[link.other_column][i])
            keep &= link.holds(y, x)
        matched = mask_positions[keep]
        mine = np.full(len(matched), p, dtype=np.int64)
        out.append(np.column_stack((mine, matched) if outer < inner else (matched, mine)))
    return np.concatenate(out) if out else np.empty((0, 2), dtype=np.int64)


def _driver(links: list[Link]) -> int | None:
    """The factor to drive the next step: an equality if there is one (most selective
    on uniform data, and a sort-merge), else an inequality (a range per struct)."""
    best = None
    for i, link in enumerate(links):
        rel = link.rel
        if rel == "=":
            return i
        if rel != "!=" and best is None:
            best = i
    return best


def _ranges(y_sorted: np.ndarray, target: np.ndarray, rel: str) -> tuple[np.ndarray, np.ndarray]:
    """For each target t, the index range of sorted y with `y rel t`."""
    n = len(y_sorted)
    if rel == "=":
        return (np.searchsorted(y_sorted, target, "left"),
                np.searchsorted(y_sorted, target, "right"))
    zeros = np.zeros(len(target), dtype=np.int64)
    full = np.full(len(target), n, dtype=np.int64)
    if rel == "<":
        return zeros, np.searchsorted(y_sorted, target, "left")
    if rel == "<=":
        return zeros, np.searchsorted(y_sorted, target, "right")
    if rel == ">":
        return np.searchsorted(y_sorted, target, "right"), full
    if rel == ">=":
        return np.searchsorted(y_sorted, target, "left"), full
    raise ValueError(f"{rel!r} cannot drive a join step")
