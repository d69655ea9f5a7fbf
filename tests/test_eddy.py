"""The Eddy alone (PSoup Sect. 4.1): entries leave the new tuple pool in arrival order,
each one's whole effect (its temporary tuple pool) is delivered before the next starts,
probes reach exactly the sinks of their slots, and a removal detaches them.

A recording sink stands in for the Results Structure, so these tests see what the eddy
delivers and nothing else.
"""

from __future__ import annotations

import numpy as np
import pytest

from psoup.bits import slot_rows
from psoup.eddy.eddy import Eddy
from psoup.query import compile_statement
from psoup.results.base import Sink, SinkTable
from psoup.stems.batch import make_batch
from psoup.stems.data_stem import DataSteM
from psoup.plans import SelectionPlan
from psoup.stems.query_stem import QuerySteM


class Recorder(Sink):
    """Remembers every event, with the slots of each batch's bits it was shown."""

    def __init__(self, log: list, name: str, keeps_rows: bool = False):
        self.log, self.name, self.keeps_rows = log, name, keeps_rows

    def on_register(self, slot, stream, positions):
        self.log.append((self.name, "register", slot, positions.tolist()))

    def on_insert(self, stream, p0, bits, batch):
        shown = [s for s in range(bits.shape[1] * 64) if len(slot_rows(bits, s))]
        self.log.append((self.name, "insert", p0, shown, batch["a"].tolist()))

    def on_expire(self, stream, horizon):
        self.log.append((self.name, "expire", horizon))

    def on_unregister(self, slot):
        self.log.append((self.name, "unregister", slot))

    def nbytes(self):
        return 0


@pytest.fixture
def world():
    schema = compile_statement("CREATE STREAM R (a INT) RETAIN 4 ROWS", {})
    stems = {"R": DataSteM(schema, chunk_rows=2)}
    sinks = SinkTable()
    eddy = Eddy(stems, QuerySteM(), sinks)
    return schema, stems, sinks, eddy


def _plan(eddy, schema, where):
    query = compile_statement(f"SELECT a FROM R WHERE {where}", {"R": schema})
    return SelectionPlan(eddy.query_stem.allocate(), query)


def _batch(schema, stem, values, ts):
    return make_batch(schema, [(v,) for v in values], ts, 0.0, stem.last_ts)


def test_entries_apply_in_arrival_order_each_wholly_before_the_next(world):
    schema, stems, sinks, eddy = world
    log: list = []
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


def test_a_sink_that_keeps_rows_sees_only_its_own_slots(world):
    schema, stems, sinks, eddy = world
    log: list = []
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


def test_removal_detaches_the_slot_and_frees_it(world):
    schema, stems, sinks, eddy = world
    log: list = []
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


def test_without_materializing_nothing_is_probed(world):
    schema, stems, sinks, _ = world
    eddy = Eddy(stems, QuerySteM(), sinks, materializes=False)
    log: list = []
    plan = _plan(eddy, schema, "a > 0")
    sinks.attach(plan.slot, "R", Recorder(log, "s"))
    eddy.submit_query(plan)
    eddy.submit_data("R", _batch(schema, stems["R"], [5], 1.0), np.array([0]))
    eddy.run()
    assert [e[1] for e in log] == ["expire"]
    assert stems["R"].n == 1 and plan.slot in eddy.query_stem.queries


def test_expiry_reaches_the_sinks_of_the_stream(world):
    schema, stems, sinks, eddy = world
    log: list = []
    plan = _plan(eddy, schema, "a > 0")
    sinks.attach(plan.slot, "R", Recorder(log, "s"))
    eddy.submit_query(plan)
    eddy.submit_data("R", _batch(schema, stems["R"], [1, 2, 3, 4, 5, 6], 1.0), np.arange(6))
    eddy.run()
    assert ("s", "expire", 2) in log                # RETAIN 4 ROWS of 6
    stems["R"]._check()


def test_an_entry_of_no_known_kind_is_refused(world):
    *_, eddy = world
    eddy.ntp.append(object())
    with pytest.raises(TypeError, match="no route"):
        eddy.run()
