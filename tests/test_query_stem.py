"""The Query SteM and its predicate index alone (PSoup Sect. 4.2.2): registering and
removing queries in any order, probing batches, and checking every structure's
invariants (`_check`) after each step.

The oracle is each query's factors evaluated on their own (psoup.stems.predicates,
itself checked against DuckDB by the differential tests): the shared index must give
exactly the same bits, whatever has been registered and removed before.
"""

from __future__ import annotations

from typing import Any, Literal

import hypothesis.strategies as st
import numpy as np
from hypothesis import given

from psoup.bits import slot_rows
from psoup.query.model import AttrPredicate, ColumnType, CompareOp, Query
from psoup.query.normalize import AttrFactor, fold_column
from psoup.stems.predicate_index import AttributeIndex
from psoup.stems.predicates import attr_mask, source_mask
from psoup.stems.query_stem import QuerySteM
from tests.strategies import StemScenario, stem_scenarios
from tests.support import compiled_query, compiled_schema, probe_columns

SCHEMA_STREAM = "R"

def _folded(factor: AttrFactor) -> AttrPredicate:
    """The predicate of one satisfiable factor."""
    pred = fold_column([factor])
    assert pred is not None
    return pred


@given(stem_scenarios(), st.booleans())
def test_probe_bits_equal_each_query_on_its_own(scenario: StemScenario, shared: bool) -> None:
    columns, steps = scenario
    ddl = "CREATE STREAM R (" + ", ".join(f"{c} {t.upper()}" for c, t in columns) + ")"
    schema = compiled_schema(ddl)
    stem = QuerySteM(shared=shared)
    live: dict[int, Query] = {}
    tid = 0
    for kind, arg in steps:
        if kind == "register":
            sql = "SELECT * FROM R" + (f" WHERE {arg}" if arg else "")
            query = compiled_query(sql, schema)
            slot = stem.insert(query)
            assert slot not in live
            assert slot == min(set(range(len(live) + 1)) - set(live)), "lowest free slot"
            live[slot] = query
        elif kind == "remove" and live:
            slot = sorted(live)[arg % len(live)]
            assert stem.remove(slot) is live.pop(slot)
        elif kind == "probe":
            cols = probe_columns(schema, arg, tid)
            tid += len(arg)
            bits = stem.probe("R", cols, len(arg))
            assert bits.shape == (len(arg), stem.words)
            for slot, query in live.items():
                want = (np.zeros(len(arg), bool) if query.contradiction
                        else source_mask(query.sources[0], cols, len(arg)))
                assert slot_rows(bits, slot).tolist() == np.flatnonzero(want).tolist(), \
                    (slot, query.sql)
            freed = set(range(stem.words * 64)) - set(live)
            assert all(len(slot_rows(bits, s)) == 0 for s in freed), "free slots match nothing"
        stem._check()


def test_a_stream_nobody_queries_probes_to_zero_rows() -> None:
    stem = QuerySteM()
    assert stem.probe("S", {}, 3).tolist() == [[0], [0], [0]]
    assert not stem.interested("S")


def test_slots_widen_the_bit_rows_by_whole_words_and_are_reused_lowest_first() -> None:
    schema = compiled_schema("CREATE STREAM R (a INT)")
    query = compiled_query("SELECT a FROM R WHERE a > 1", schema)
    stem = QuerySteM()
    slots = [stem.insert(query) for _ in range(65)]
    assert slots == list(range(65)) and stem.words == 2
    stem.remove(3)
    stem.remove(1)
    assert stem.insert(query) == 1 and stem.insert(query) == 3 and stem.insert(query) == 65
    stem._check()


def test_wide_tables_probe_exactly_and_keep_rows_off_power_of_two_strides() -> None:
    # 4,500 queries (71 words) on two attributes: the reject tables grow past 8 cache
    # lines per row, to an odd number of lines, and the probe still gives each query's
    # own bits; removing some keeps it so
    schema = compiled_schema("CREATE STREAM R (a INT, b INT)")
    gen = np.random.default_rng(5)
    ops = ["<", "<=", ">", ">=", "=", "!="]
    stem = QuerySteM()
    live: dict[int, Query] = {}
    for i in range(4500):
        sql = (f"SELECT * FROM R WHERE a {ops[i % 6]} {int(gen.integers(0, 40))}"
               + (f" AND b {ops[(i // 6) % 6]} {int(gen.integers(0, 40))}" if i % 3 else ""))
        query = compiled_query(sql, schema)
        live[stem.insert(query)] = query
    for slot in range(0, 4500, 7):
        stem.remove(slot)
        del live[slot]
    rows = [tuple(int(v) for v in gen.integers(-2, 42, 2)) for _ in range(300)]
    cols = probe_columns(schema, rows, 0)
    bits = stem.probe("R", cols, len(rows))
    for slot, query in live.items():
        want = source_mask(query.sources[0], cols, len(rows))
        assert slot_rows(bits, slot).tolist() == np.flatnonzero(want).tolist(), query.sql
    widths = {index.table(stem.words).shape[1]
              for sq in stem._streams.values() for index in sq.attrs.values()}
    assert widths and all(w >= stem.words and w > 64 and (w // 8) % 2 == 1
                          for w in widths), widths
    stem._check()


# In the order the strategies drew them as strings, so examples shrink the same way.
_FACTOR_OPS: list[CompareOp | Literal["in"]] = [
    CompareOp.LT, CompareOp.LE, CompareOp.GT, CompareOp.GE, CompareOp.EQ, CompareOp.NE, "in"]


@given(st.lists(st.tuples(st.sampled_from(_FACTOR_OPS),
                          st.lists(st.integers(-5, 5), min_size=1, max_size=3)),
                min_size=1, max_size=12),
       st.lists(st.integers(0, 11), max_size=6),
       st.lists(st.integers(-8, 8), min_size=1, max_size=100))
def test_attribute_index_rejects_exactly_what_each_predicate_rejects(
        preds: list[tuple[CompareOp | Literal["in"], list[int]]], removals: list[int],
        values: list[int]) -> None:
    index = AttributeIndex(ColumnType.INT)
    live: dict[int, AttrPredicate] = {}
    for slot, (op, constants) in enumerate(preds):
        value = tuple(constants) if op == "in" else constants[0]
        pred = fold_column([AttrFactor("a", ColumnType.INT, op, value)])
        if pred is None:
            continue
        index.add(slot, pred)
        live[slot] = pred
        index._check()
    for r in removals:
        if live:
            slot = sorted(live)[r % len(live)]
            index.remove(slot)
            del live[slot]
            index._check()
    arr = np.array(values, dtype=np.int64)
    rejects = index.probe(arr, 1)
    index._check()
    for slot, pred in live.items():
        assert slot_rows(rejects, slot).tolist() == np.flatnonzero(~attr_mask(pred, arr)).tolist()


def test_attribute_index_over_text_values_compares_by_code_point() -> None:
    index = AttributeIndex(ColumnType.TEXT)
    index.add(0, AttrPredicate("t", ColumnType.TEXT, lo="b"))
    index.add(1, AttrPredicate("t", ColumnType.TEXT, eq=frozenset({"é"})))
    values = np.array(["a", "b", "z", "é"], dtype=object)
    rejects = index.probe(values, 1)
    assert slot_rows(rejects, 0).tolist() == [0]          # "a" < "b"; "é" > "z" > "b"
    assert slot_rows(rejects, 1).tolist() == [0, 1, 2]
    index._check()


_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(_FACTOR_OPS),
              st.lists(st.integers(-6, 40), min_size=1, max_size=3)),
    st.tuples(st.just("remove"), st.integers(0, 200)),
    st.tuples(st.just("probe"), st.lists(st.integers(-9, 45), min_size=1, max_size=150)
              | st.lists(st.integers(-9, 45), min_size=64, max_size=80))),  # direct map
    min_size=1, max_size=40)


@given(_OPS, st.sampled_from([ColumnType.INT, ColumnType.FLOAT]))
def test_attribute_index_stays_exact_as_queries_come_and_go_between_probes(
        ops: list[tuple[Any, ...]], ctype: ColumnType) -> None:
    """The query stream is a stream: constants split and merge cells between probes
    (over 64 integers a probe also builds and patches the direct value map)."""
    index = AttributeIndex(ctype)
    live: dict[int, AttrPredicate] = {}
    kind = np.int64 if ctype is ColumnType.INT else np.float64
    for op in ops:
        if op[0] == "add":
            value = tuple(op[2]) if op[1] == "in" else op[2][0]
            pred = fold_column([AttrFactor("a", ctype, op[1], value)])
            if pred is None:
                continue
            slot = min(set(range(len(live) + 1)) - set(live))
            index.add(slot, pred)
            live[slot] = pred
        elif op[0] == "remove" and live:
            slot = sorted(live)[op[1] % len(live)]
            index.remove(slot)
            del live[slot]
        elif op[0] == "probe":
            arr = np.array(op[1], dtype=kind) / (1 if ctype is ColumnType.INT else 2)
            arr = arr.astype(kind)
            rejects = index.probe(arr, max(live, default=0) // 64 + 1)
            for slot, pred in live.items():
                want = np.flatnonzero(~attr_mask(pred, arr)).tolist()
                assert slot_rows(rejects, slot).tolist() == want, (slot, pred)
        index._check()


def test_a_new_constant_below_the_direct_map_leaves_the_map_alone() -> None:
    """Hypothesis found it: keys -3 and -1 both below a direct map over [0, 1] once made
    the patch's slice end negative, pointing value 0 at the new gap's row."""
    index = AttributeIndex(ColumnType.INT)
    index.add(0, _folded(AttrFactor("a", ColumnType.INT, CompareOp.LT, 0)))
    values = np.array([0] * 63 + [1], np.int64)         # 64 values: the map is built
    index.probe(values, 1)
    index.add(1, _folded(AttrFactor("a", ColumnType.INT, CompareOp.LT, -2)))
    index._check()
    assert slot_rows(index.probe(values, 1), 0).tolist() == list(range(64))
    assert slot_rows(index.probe(values, 1), 1).tolist() == list(range(64))


def test_an_integer_attributes_reachable_rows_stay_together_and_rows_stay_narrow() -> None:
    """Every value 0..255 a constant, filed in random order: the rows the values reach
    (one constant's cell each, none of the gaps between consecutive constants) lie in a
    few runs of consecutive rows (the lower half of each doubling of the table), not in
    every other row; and 10,000 slots (157 words) make rows the fewest odd number of whole
    cache lines that hold them (21 lines, as row_words promises), not twice the width
    before the last widening."""
    from psoup.stems.predicate_index import row_words
    index = AttributeIndex(ColumnType.INT)
    order = np.random.default_rng(7).permutation(256)
    for slot, c in enumerate(order):
        index.add(slot, _folded(AttrFactor("a", ColumnType.INT, CompareOp.LT, int(c))))
    for slot in range(256, 10_000):
        index.add(slot, _folded(
            AttrFactor("a", ColumnType.INT, CompareOp.GE, int(order[slot % 256]))))
    index._check()
    values = np.arange(256, dtype=np.int64)
    rows = np.unique(index.rows(values))
    assert len(rows) == 256
    runs = 1 + int((np.diff(rows) > 1).sum())
    assert runs <= 12, (runs, rows.tolist())           # one per doubling, at most
    words = (10_000 + 63) // 64
    width = index.table(words).shape[1]
    # whole cache lines of 8 words, an odd number of them (past 8 lines), and the fewest
    # such that hold the bits: two lines fewer would not
    assert width == row_words(words)
    assert width % 8 == 0 and (width // 8) % 2 == 1 and words <= width < words + 2 * 8
    probe = index.probe(values, words)
    for slot in (0, 255, 9_999):
        rejects = set(slot_rows(probe, slot).tolist())
        want = ~attr_mask(index._preds[slot], values)
        assert rejects == set(np.flatnonzero(want).tolist()), slot


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]),
                          st.sampled_from(["<", "<=", ">", ">=", "=", "!="]),
                          st.integers(-20, 60)), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(1, 120), st.integers(-30, 40), st.booleans()),
                min_size=1, max_size=5))
def test_batches_of_small_integers_probe_through_the_direct_maps(
        preds: list[tuple[str, str, int]], batches: list[tuple[int, int, bool]]) -> None:
    """Batches of integers in a small range find their cells through each attribute's
    direct value -> row map (built by a batch of 64 or more); a batch with values past a
    map extends it, and one with a value far outside it (past DIRECT_MAP_LIMIT) is
    searched instead, the map kept."""
    schema = compiled_schema("CREATE STREAM R (a INT, b INT)")
    stem = QuerySteM()
    live: dict[int, Query] = {}
    for column, op, c in preds:
        query = compiled_query(f"SELECT * FROM R WHERE {column} {op} {c}", schema)
        live[stem.insert(query)] = query
    gen = np.random.default_rng(len(preds))
    tid = 0
    for n, shift, far in batches:
        rows = [(int(a), int(b) + 7) for a, b in gen.integers(0, 25, (n, 2)) + shift]
        if far:
            rows[int(gen.integers(n))] = (10**9, -(10**9))
        cols = probe_columns(schema, rows, tid)
        cols["b"].flags.writeable = False           # as a column read from Arrow is
        tid += n
        bits = stem.probe("R", cols, n)
        for slot, query in live.items():
            want = source_mask(query.sources[0], cols, n)
            assert slot_rows(bits, slot).tolist() == np.flatnonzero(want).tolist(), query.sql
        stem._check()
