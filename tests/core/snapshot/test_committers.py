"""Merged commits (``core.snapshot.committers``): a batch of more participants than
``commit_parallelism`` commits in that many units, as its decision recorded them."""

from __future__ import annotations

import pytest

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.faults import DRIVER_POINTS, TASK_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.committers import COMMITTER, assign, units
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import OneProcessRunner, run_uncommitted
from tests.support.memory import (
    ListRunner,
    MemorySink,
    MemoryStore,
    MemorySystem,
    MergingMemorySink,
    TaskCommitMergingMemorySink,
)

BATCHES = [[[1, 2], [3], [4]], [[5], [6, 7], [8]], [[9], [], [10]], [[11], [12], [13]]]
ALL_IDS = list(range(1, 14))


def participants(*partitions: int, member: str = "m") -> list[dict]:
    return [{"partition": p, "member": member, "tag": 0, "receipt": {}} for p in partitions]


def member_of(participant: dict) -> str:
    return str(participant["member"])


MERGING = {"m": MergingMemorySink(MemorySystem()), "kafka": MergingMemorySink(MemorySystem()),
           "db": MemorySink(MemorySystem())}


def here(_member: str) -> bool:
    return True


def test_participants_past_the_parallelism_get_contiguous_committers():
    decided = participants(5, 0, 7, 1, 2, 3, 4, 6)
    assign(decided, MERGING, 4, member_of, here)
    by_partition = {p["partition"]: p[COMMITTER] for p in decided}
    assert [by_partition[p] for p in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    uneven = participants(0, 1, 2, 3, 4)
    assign(uneven, MERGING, 2, member_of, here)
    assert [p[COMMITTER] for p in uneven] == [0, 0, 0, 1, 1]


def test_few_participants_a_sink_that_does_not_merge_or_commits_spread_commit_alone():
    few = participants(0, 1)
    assign(few, MERGING, 2, member_of, here)
    other = participants(0, 1, 2, member="db")
    assign(other, MERGING, 1, member_of, here)
    spread = participants(0, 1, 2)
    assign(spread, MERGING, 1, member_of, lambda _m: False)
    assert all(COMMITTER not in p for p in few + other + spread)


def test_each_member_of_a_group_is_grouped_on_its_own():
    decided = participants(0, 1, 2, member="kafka") + participants(0, 1, 2, member="db")
    assign(decided, MERGING, 1, member_of, here)
    assert [p.get(COMMITTER) for p in decided] == [0, 0, 0, None, None, None]


def test_a_sink_whose_groups_do_not_fit_its_receipts_is_refused_before_the_decision():
    class Broken(MergingMemorySink):
        def commit_groups(self, receipts, committers):
            return [0]

    with pytest.raises(ConfigurationError, match="one committer number"):
        assign(participants(0, 1, 2), {"m": Broken(MemorySystem())}, 1, member_of, here)


def test_units_follow_the_recorded_committers_first_partition_first():
    pool = TransactionPool("q", "s")
    txn = {p: pool.transaction(0, p, 0, 0) for p in range(5)}
    found = units([(txn[3], {"p": 3}, 1), (txn[0], {"p": 0}, 0), (txn[4], {"p": 4}, None),
                   (txn[2], {"p": 2}, 1), (txn[1], {"p": 1}, 0)])
    assert [[t.partition for t, _r in unit] for unit in found] == [[0, 1], [2, 3], [4]]
    assert found[1][1] == (txn[3], {"p": 3})


def coordinator(system: MemorySystem, log: CommitLog, sink_class: type[MemorySink],
                faults: FaultPlan | None = None, parallelism: int = 2) -> Coordinator:
    config = CoordinatorConfig(name="mem", commit_parallelism=parallelism)
    return Coordinator(sink_class(system), config, log, "q1", faults)


@pytest.mark.parametrize("sink_class", [MergingMemorySink, TaskCommitMergingMemorySink])
@pytest.mark.parametrize("point", DRIVER_POINTS + TASK_POINTS)
def test_merged_commits_survive_a_crash_at_every_point(point, sink_class):
    system, log, committed = MemorySystem(), CommitLog(MemoryStore()), []
    try:
        run_uncommitted(coordinator(system, log, sink_class, FaultPlan(point, 1, simulate=True)),
                        BATCHES, committed, OneProcessRunner)
    except InjectedCrash:
        pass
    run_uncommitted(coordinator(system, log, sink_class), BATCHES, committed, OneProcessRunner)
    assert sorted(system.visible) == ALL_IDS, point
    assert not system.prepared
    # Three participants, two committers: partitions 0 and 1 commit together.
    assert (0, 1) in system.merged
    assert all(len(unit) == 2 for unit in system.merged)


def test_a_recovery_commits_as_the_decision_grouped_whatever_its_own_parallelism():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        coordinator(system, log, MergingMemorySink, FaultPlan("after_decided", 0, simulate=True),
                    parallelism=1).run_batch(0, ListRunner([[1], [2], [3]]))
    decided = log.batches()[0].decided
    assert decided is not None
    assert [p[COMMITTER] for p in decided["participants"]] == [0, 0, 0]
    metrics = coordinator(system, log, MergingMemorySink, parallelism=8).run_batch(
        0, ListRunner([[1], [2], [3]]))
    assert metrics.outcome == "replayed"
    assert system.merged == [(0, 1, 2)] and sorted(system.visible) == [1, 2, 3]


def test_commits_spread_over_spark_tasks_are_not_merged():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coordinator(system, log, TaskCommitMergingMemorySink, parallelism=1).run_batch(
        0, ListRunner([[1], [2], [3]]))  # stands in for Spark's tasks
    decided = log.batches()[0].decided
    assert decided is not None
    assert all(COMMITTER not in p for p in decided["participants"])
    assert system.merged == [] and sorted(system.visible) == [1, 2, 3]


def test_a_decision_without_committers_commits_each_participant_alone():
    """A record from before merging existed: a merging sink commits it as decided."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        coordinator(system, log, MemorySink, FaultPlan("after_decided", 0, simulate=True),
                    parallelism=1).run_batch(0, ListRunner([[1], [2], [3]]))
    coordinator(system, log, MergingMemorySink, parallelism=1).run_batch(
        0, ListRunner([[1], [2], [3]]))
    assert system.merged == [] and sorted(system.visible) == [1, 2, 3]


def test_a_merged_decision_refuses_a_sink_that_does_not_merge():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        coordinator(system, log, MergingMemorySink, FaultPlan("after_decided", 0,
                                                              simulate=True),
                    parallelism=1).run_batch(0, ListRunner([[1], [2]]))
    with pytest.raises(ConfigurationError, match="does not merge commits"):
        coordinator(system, log, MemorySink).run_batch(0, ListRunner([[1], [2]]))
    assert system.visible == []


def test_commits_on_the_driver_go_on_one_by_one_when_the_interpreter_exits(monkeypatch):
    """At the interpreter's exit (which waits for a batch committing in the background)
    no thread pool takes new work: the commits run in the committing thread instead."""
    import concurrent.futures.thread as futures_thread

    system, log = MemorySystem(), CommitLog(MemoryStore())
    monkeypatch.setattr(futures_thread, "_shutdown", True)
    coordinator(system, log, MemorySink, parallelism=3).run_batch(
        0, ListRunner([[1], [2], [3]]))
    assert sorted(system.visible) == [1, 2, 3]
