"""The replay rule (``core.replay``) with the in-memory participant: a replay of a
batch partitioned otherwise than the run that committed part of it loses nothing, and
one partitioned as before writes nothing twice; what each receipt says reaches the
batch's metrics and the ``replay.nondeterministic`` report."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from sparkeos.core.commitlog import CommitLog
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.coordinator import Coordinator
from sparkeos.core.faults import InjectedTaskFailure
from sparkeos.testing.inprocess import ArrowRunner
from tests.support.memory import MemorySink, MemoryStore, MemorySystem, id_batch


def at_least_once(system: MemorySystem) -> Coordinator:
    return Coordinator(MemorySink(system),
                       CoordinatorConfig(name="mem", guarantee=Guarantee.AT_LEAST_ONCE),
                       None, "q1")


def failing_last(partitions: list[list[int]]) -> ArrowRunner:
    """A batch whose last partition's task fails for good after the others committed."""
    last = len(partitions) - 1

    def fail(partition: int, attempt: int) -> None:
        if partition == last:
            raise InjectedTaskFailure("the last task dies")

    return ArrowRunner([id_batch(ids) for ids in partitions], max_attempts=1,
                       before_attempt=fail)


@pytest.mark.parametrize("replay", [[[1, 2, 3], [4, 5, 6]], [[2, 1], [4], [3], [5, 6]]],
                         ids=["fewer", "more"])
def test_at_least_once_replay_partitioned_otherwise_loses_nothing(
        replay: list[list[int]], caplog: pytest.LogCaptureFixture) -> None:
    system = MemorySystem()
    with pytest.raises(InjectedTaskFailure):
        at_least_once(system).run_batch(0, failing_last([[1, 2], [3, 4], [5, 6]]))
    assert sorted(system.visible) == [1, 2, 3, 4], "partitions 0 and 1 committed"
    with caplog.at_level(logging.WARNING, logger="sparkeos"):
        metrics = at_least_once(system).run_batch(
            0, ArrowRunner([id_batch(ids) for ids in replay]))
    assert set(system.visible) == {1, 2, 3, 4, 5, 6}, (
        "a partition skipped on its marker alone lost rows")
    assert metrics.replays_rewritten == 2 and metrics.replays_skipped == 0
    reports = [r for r in caplog.records if "replay.nondeterministic" in r.getMessage()]
    assert len(reports) == 2 and reports[0].sparkeos["batch"] == 0


def test_at_least_once_replay_partitioned_as_before_writes_nothing_twice() -> None:
    system = MemorySystem()
    with pytest.raises(InjectedTaskFailure):
        at_least_once(system).run_batch(0, failing_last([[1, 2], [3, 4], [5, 6]]))
    metrics = at_least_once(system).run_batch(
        0, ArrowRunner([id_batch(ids) for ids in [[1, 2], [3, 4], [5, 6]]]))
    assert Counter(system.visible) == Counter([1, 2, 3, 4, 5, 6])
    assert (metrics.replays_skipped, metrics.replays_rewritten) == (2, 0)


def test_a_switch_to_exactly_once_over_a_half_written_batch_loses_nothing() -> None:
    """A query ran at-least-once, died with batch 0 half written, and restarts under
    exactly-once (same query, same sink name) with fewer partitions."""
    system = MemorySystem()
    with pytest.raises(InjectedTaskFailure):
        at_least_once(system).run_batch(0, failing_last([[1, 2], [3, 4], [5, 6]]))
    exactly = Coordinator(MemorySink(system), CoordinatorConfig(name="mem"),
                          CommitLog(MemoryStore()), "q1")
    exactly.run_batch(0, ArrowRunner([id_batch([1, 2, 3]), id_batch([4, 5, 6])]))
    exactly.run_batch(1, ArrowRunner([id_batch([7]), id_batch([8])]))
    assert set(system.visible) == set(range(1, 9))
    assert Counter(system.visible)[7] == Counter(system.visible)[8] == 1
