"""Property: any sequence of crashes across many batches loses and duplicates nothing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import ALL_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from tests.support.memory import (
    ListRunner,
    MemorySink,
    MemoryStore,
    MemorySystem,
    TaskCommitMemorySink,
)

partitions = st.lists(st.integers(0, 4), min_size=1, max_size=4)  # rows per partition
batches = st.lists(partitions, min_size=1, max_size=8)
crashes = st.lists(st.tuples(st.sampled_from(ALL_POINTS), st.integers(0, 7)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(batches=batches, crashes=crashes, data=st.data(),
       sink_class=st.sampled_from([MemorySink, TaskCommitMemorySink]))
def test_random_crashes_never_lose_or_duplicate(batches, crashes, data, sink_class):
    next_id = iter(range(1_000_000))
    plan = [[[next(next_id) for _ in range(n)] for n in parts] for parts in batches]
    expected = sorted(i for parts in plan for ids in parts for i in ids)

    system, log = MemorySystem(), CommitLog(MemoryStore())
    spark_committed = 0  # Spark's own commit log: batches below this are never re-run
    for point, batch in [*crashes, (None, None)]:
        faults = FaultPlan(point, batch, simulate=True) if point else None
        coord = Coordinator(sink_class(system), CoordinatorConfig(name="p"), log, "q", faults)
        try:
            while spark_committed < len(plan):
                parts = plan[spark_committed]
                # A restarted query may plan the re-run with different parallelism.
                if data.draw(st.booleans(), label="repartition"):
                    flat = [i for ids in parts for i in ids]
                    parts = [flat[0::2], flat[1::2]]
                coord.run_batch(spark_committed, ListRunner(parts))
                spark_committed += 1
        except InjectedCrash:
            continue  # the process died; the loop restarts it
    assert sorted(system.visible) == expected
    assert not system.prepared and not system.open
    assert all(not s.unresolved for s in log.batches().values())
