"""The Eddy alone (PSoup Sect. 4.1): entries leave the new tuple pool in arrival order,
each one's whole effect (its temporary tuple pool) is delivered before the next starts,
probes reach exactly the sinks of their slots, and a removal detaches them.

A recording sink stands in for the Results Structure, so these tests see what the eddy
delivers and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import numpy as np
import pytest
from numpy.typing import NDArray

from psoup.bits import slot_rows
from psoup.eddy.eddy import Eddy
from psoup.plans import SelectionPlan
from psoup.query import compile_statement
from psoup.query.model import Query, StreamSchema
from psoup.results.base import Sink, SinkTable
from psoup.stems.batch import Batch, make_batch
from psoup.stems.data_stem import DataSteM
from psoup.stems.query_stem import QuerySteM

#: The `world` fixture: R's schema, its Data SteM by name, the sink table, the eddy.
World: TypeAlias = tuple[StreamSchema, dict[str, DataSteM], SinkTable, Eddy]


class Recorder(Sink):
    """Remembers every event, with the slots of each batch's bits it was shown."""

    def __init__(self, log: list[tuple[Any, ...]], name: str, keeps_rows: bool = False) -> None:
        self.log, self.name, self.keeps_rows = log, name, keeps_rows

    def on_register(self, slot: int, stream: str, positions: NDArray[np.int64]) -> None:
        self.log.append((self.name, "register", slot, positions.tolist()))

    def on_insert(self, stream: str, p0: int, bits: NDArray[np.uint64],
                  batch: Mapping[str, NDArray[Any]]) -> None:
        shown = [s for s in range(bits.shape[1] * 64) if len(slot_rows(bits, s))]
        self.log.append((self.name, "insert", p0, shown, batch["a"].tolist()))

    def on_expire(self, stream: str, horizon: int) -> None:
        self.log.append((self.name, "expire", horizon))

    def on_unregister(self, slot: int) -> None:
        self.log.append((self.name, "unregister", slot))

    def nbytes(self) -> int:
        return 0


@pytest.fixture
def world() -> World:
    schema = compile_statement("CREATE STREAM R (a INT) RETAIN 4 ROWS", {})
    assert isinstance(schema, StreamSchema)
    stems = {"R": DataSteM(schema, chunk_rows=2)}
    sinks = SinkTable()
    eddy = Eddy(stems, QuerySteM(), sinks)
    return schema, stems, sinks, eddy


def _plan(eddy: Eddy, schema: StreamSchema, where: str) -> SelectionPlan:
    query = compile_statement(f"SELECT a FROM R WHERE {where}", {"R": schema})
    assert isinstance(query, Query)
    return SelectionPlan(eddy.query_stem.allocate(), query)


def _batch(schema: StreamSchema, stem: DataSteM, values: list[int], ts: float) -> Batch:
    return make_batch(schema, [(v,) for v in values], ts, 0.0, stem.last_ts)


def test_entries_apply_in_arrival_order_each_wholly_before_the_next(world: World) -> None:
    schema, stems, sinks, eddy = world
    log: list[tuple[Any, ...]] = []
    sink = Recorder(log, "s")
    big = _plan(eddy, schema, "a > 5")
    sinks.attach(big.slot, "R", sink)
    eddy.submit_data("R", _batch(schema, stems["R"], [1, 9], 1.0), np.array([0, 1]))
    eddy.submit_query(big)                         # after the first batch...
    eddy.submit_data("R", _batch(schema, stems["R"], [7], 2.0), np.array([2]))
    assert eddy.run() == 3
    # the query entered after batch 1: batch 1 reached it through its Data SteM probe
    # (new query over old data), batch 2 through the Query SteM probe
    assert log == [("s", "expire", 0), ("s", "register", 0, [1]),
                   ("s", "expire", 0), ("s", "insert", 2, [0], [7])]


def test_a_sink_that_keeps_rows_sees_only_its_own_slots(world: World) -> None:
    schema, stems, sinks, eddy = world
    log: list[tuple[Any, ...]] = []
    mine, other = Recorder(log, "mine", keeps_rows=True), Recorder(log, "other")
    p, q = _plan(eddy, schema, "a > 0"), _plan(eddy, schema, "a > 1")
    sinks.attach(p.slot, "R", mine)
    sinks.attach(q.slot, "R", other)
    for plan in (p, q):
        eddy.submit_query(plan)
    eddy.submit_data("R", _batch(schema, stems["R"], [5], 1.0), np.array([0]))
    eddy.run()
    inserts = [e for e in log if e[1] == "insert"]
    assert inserts == [("mine", "insert", 0, [p.slot], [5]),
                       ("other", "insert", 0, [p.slot, q.slot], [5])]


def test_removal_detaches_the_slot_and_frees_it(world: World) -> None:
    schema, stems, sinks, eddy = world
    log: list[tuple[Any, ...]] = []
    sink = Recorder(log, "s")
    plan = _plan(eddy, schema, "a > 0")
    sinks.attach(plan.slot, "R", sink)
    eddy.submit_query(plan)
    eddy.submit_removal(plan)
    eddy.submit_data("R", _batch(schema, stems["R"], [5], 1.0), np.array([0]))
    eddy.run()
    assert ("s", "unregister", plan.slot) in log
    assert not any(e[1] == "insert" for e in log)   # nobody listens any more
    assert plan.slot not in eddy.query_stem.queries
    eddy.query_stem._check()


def test_without_materializing_nothing_is_probed(world: World) -> None:
    schema, stems, sinks, _ = world
    eddy = Eddy(stems, QuerySteM(), sinks, materializes=False)
    log: list[tuple[Any, ...]] = []
    plan = _plan(eddy, schema, "a > 0")
    sinks.attach(plan.slot, "R", Recorder(log, "s"))
    eddy.submit_query(plan)
    eddy.submit_data("R", _batch(schema, stems["R"], [5], 1.0), np.array([0]))
    eddy.run()
    assert [e[1] for e in log] == ["expire"]
    assert stems["R"].n == 1 and plan.slot in eddy.query_stem.queries


def test_expiry_reaches_the_sinks_of_the_stream(world: World) -> None:
    schema, stems, sinks, eddy = world
    log: list[tuple[Any, ...]] = []
    plan = _plan(eddy, schema, "a > 0")
    sinks.attach(plan.slot, "R", Recorder(log, "s"))
    eddy.submit_query(plan)
    eddy.submit_data("R", _batch(schema, stems["R"], [1, 2, 3, 4, 5, 6], 1.0), np.arange(6))
    eddy.run()
    assert ("s", "expire", 2) in log                # RETAIN 4 ROWS of 6
    stems["R"]._check()


def test_an_entry_of_no_known_kind_is_refused(world: World) -> None:
    *_, eddy = world
    eddy.ntp.append(object())  # type: ignore[arg-type]  # no known kind, on purpose
    with pytest.raises(TypeError, match="no route"):
        eddy.run()
