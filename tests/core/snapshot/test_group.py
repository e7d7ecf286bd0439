"""Several sinks under one decision (SinkGroup): a batch lands in every member or, after
recovery, in none; every member's ids exactly once under a crash at every point."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.faults import DRIVER_POINTS, TASK_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SinkGroup
from sparkeos.testing.inprocess import ArrowRunner
from tests.support.memory import (
    ListRunner,
    MemorySink,
    MemoryStore,
    MemorySystem,
    TaskCommitMemorySink,
)

# Member "db" gets the batch in two partitions, "events" in one.
BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8, 9], []]]
ALL_IDS = list(range(1, 10))


def group(db: MemorySystem, events: MemorySystem) -> SinkGroup:
    return SinkGroup({"db": MemorySink(db), "events": TaskCommitMemorySink(events)})


def runners(partitions: list[list[int]]) -> dict[str, Any]:
    flat = [i for p in partitions for i in p]
    return {"db": ListRunner(partitions), "events": ListRunner([flat])}


def run(sink: SinkGroup, log: CommitLog, faults: FaultPlan | None, done: list[int]) -> None:
    coord = Coordinator(sink, CoordinatorConfig(name="orders"), log, "q1", faults)
    for batch_id, partitions in enumerate(BATCHES):
        if batch_id not in done:
            coord.run_batch(batch_id, runners(partitions))
            done.append(batch_id)


@pytest.mark.parametrize("point", DRIVER_POINTS + TASK_POINTS)
def test_crash_at_every_point_then_restart(point: str) -> None:
    db, events = MemorySystem(), MemorySystem()
    log, done = CommitLog(MemoryStore()), []
    try:
        run(group(db, events), log, FaultPlan(point, 1, simulate=True), done)
    except InjectedCrash:
        pass
    if 1 not in done:
        decided = log.batches()[1].decided is not None
        # One decision for both: before it neither member shows batch 1.
        if not decided:
            assert sorted(db.visible) == sorted(events.visible) == [1, 2, 3]
    run(group(db, events), log, None, done)
    assert sorted(db.visible) == sorted(events.visible) == ALL_IDS
    assert not db.prepared and not events.prepared
    state = log.batches()[1]
    assert state.decided is not None
    members = sorted({p["member"] for p in state.decided["participants"]})
    assert members == ["db", "events"]
    assert [p["partition"] for p in state.decided["participants"]] == [0, 1, 2]


def test_a_member_that_refuses_the_batch_aborts_every_member() -> None:
    db, events = MemorySystem(), MemorySystem()
    log = CommitLog(MemoryStore())
    coord = Coordinator(group(db, events), CoordinatorConfig(name="orders"), log, "q1")
    coord.run_batch(0, runners([[1], [2]]))
    bad = runners([[3], [4]])
    bad["events"] = ArrowRunner([pa.RecordBatch.from_pydict({"id": ["3", "4"]})])
    with pytest.raises(SchemaMismatchError, match="member 'events' of this sink group"):
        coord.run_batch(1, bad)
    assert sorted(db.visible) == sorted(events.visible) == [1, 2]


def test_members_are_checked_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="not a sparkeos sink"):
        SinkGroup({"db": object()})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="invalid sink name"):
        SinkGroup({"no spaces": MemorySink(MemorySystem())})
    coord = Coordinator(group(MemorySystem(), MemorySystem()), CoordinatorConfig(name="g"),
                        CommitLog(MemoryStore()), "q1")
    with pytest.raises(ConfigurationError, match="sink group"):
        coord.sink  # noqa: B018


def test_the_group_rebuilds_from_its_description() -> None:
    from sparkeos.connectors.file import FileSink
    from sparkeos.core.snapshot.group import load_sink

    original = SinkGroup({"a": FileSink("/tmp/a"), "b": FileSink("/tmp/b", format="jsonl")})
    rebuilt = load_sink(original.type_name, {**original.describe(), "b.format": "parquet"})
    assert isinstance(rebuilt, SinkGroup)
    assert rebuilt.members["a"] == original.members["a"]
    assert rebuilt.members["b"] == FileSink("/tmp/b", format="parquet")


def test_the_recorded_type_name_of_a_group_stays_when_the_class_moves() -> None:
    """Commit logs record a group as ``sparkeos.core.group.SinkGroup`` (``sink.json``'s
    ``sink_type``, compared at every restart): the name a log written before the class
    moved to ``core.snapshot.group`` holds, read without the old module path."""
    import warnings

    from sparkeos.connectors.file import FileSink
    from sparkeos.core.snapshot.group import load_sink

    group = SinkGroup({"a": FileSink("/tmp/a")})
    assert group.type_name == "sparkeos.core.group.SinkGroup"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert isinstance(load_sink(group.type_name, group.describe()), SinkGroup)


def test_a_plain_setting_goes_only_to_the_members_that_take_it() -> None:
    """`sparkeos recover --set dsn=...` on {PostgreSQL, file}: the secret DSN (never
    recorded) reaches the PostgreSQL member; the file member, which has no such
    setting, is rebuilt as it was (it failed with an unexpected keyword before)."""
    from sparkeos.connectors.file import FileSink
    from sparkeos.connectors.jdbc import PostgresSink
    from sparkeos.core.snapshot.group import load_sink

    original = SinkGroup({"db": PostgresSink("host=h1 dbname=d user=u", table="t"),
                          "files": FileSink("/tmp/out")})
    dsn = "host=h2 dbname=d user=u password=secret"
    rebuilt = load_sink(original.type_name, {**original.describe(), "dsn": dsn})
    assert rebuilt.members["db"].dsn == PostgresSink(dsn, table="t").dsn
    assert rebuilt.members["files"] == original.members["files"]
    with pytest.raises(ConfigurationError, match="no member of the sink group has the "
                                                 "setting"):
        load_sink(original.type_name, {**original.describe(), "dns": dsn})
