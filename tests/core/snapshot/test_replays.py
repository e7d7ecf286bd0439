"""The replay rule (``core.snapshot.replay``) with the in-memory participant: a replay of a
batch partitioned otherwise than the run that committed part of it loses nothing, and
one partitioned as before writes nothing twice; what each receipt says reaches the
batch's metrics and the ``replay.nondeterministic`` report."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import ReplayUndecidableError
from sparkeos.core.faults import InjectedTaskFailure
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.fingerprint import fingerprint_of
from sparkeos.core.snapshot.replay import OnRecord, committed_before, replay
from sparkeos.core.snapshot.txpool import DIRECT_RUNS, Transaction, TransactionPool
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


@pytest.mark.parametrize("replayed", [[[1, 2, 3], [4, 5, 6]], [[2], [1, 4], [3], [5, 6]]],
                         ids=["fewer", "more"])
def test_at_least_once_replay_partitioned_otherwise_loses_nothing(
        replayed: list[list[int]], caplog: pytest.LogCaptureFixture) -> None:
    system = MemorySystem()
    with pytest.raises(InjectedTaskFailure):
        at_least_once(system).run_batch(0, failing_last([[1, 2], [3, 4], [5, 6]]))
    assert sorted(system.visible) == [1, 2, 3, 4], "partitions 0 and 1 committed"
    with caplog.at_level(logging.WARNING, logger="sparkeos"):
        metrics = at_least_once(system).run_batch(
            0, ArrowRunner([id_batch(ids) for ids in replayed]))
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


def test_at_least_once_replay_shuffled_within_its_partitions_writes_nothing_twice() -> None:
    """A shuffle upstream hands each partition of the replay the same rows in another
    order: the multiset is the same, so nothing is rewritten."""
    system = MemorySystem()
    with pytest.raises(InjectedTaskFailure):
        at_least_once(system).run_batch(0, failing_last([[1, 2, 3], [4, 5, 6], [7]]))
    metrics = at_least_once(system).run_batch(
        0, ArrowRunner([id_batch(ids) for ids in [[3, 1, 2], [6, 4, 5], [7]]]))
    assert Counter(system.visible) == Counter(range(1, 8))
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


# -- the rule itself (core.snapshot.replay), as every connector asks it ----------------------------
def _txn(batch: int, run: int = 0, durable: bool = True) -> Transaction:
    return TransactionPool("q1", "mem", durable).transaction(batch, 0, run, 0)


ROWS = fingerprint_of(id_batch([1, 2]))
OTHER = fingerprint_of(id_batch([3]))
DIRECT = DIRECT_RUNS.start


@pytest.mark.parametrize("on_record, skip", [
    (OnRecord.nothing(), False),
    (OnRecord.last_batch(4, ROWS), True),        # the same rows on record
    (OnRecord.last_batch(4, OTHER), False),      # other rows: written again
    (OnRecord.last_batch(4, None), False),       # unknown rows: written again
    (OnRecord.last_batch(6, OTHER), True),       # a later batch: a zombie of batch 4
    (OnRecord.last_batch(2, ROWS), False),       # an earlier batch
    (OnRecord.of_batch(4, [OTHER, ROWS]), True),
    (OnRecord.of_batch(4, []), False),
])
def test_phase_one_skips_only_on_the_same_rows_or_a_later_batch(
        on_record: OnRecord, skip: bool) -> None:
    assert replay(_txn(4, DIRECT), ROWS, on_record).skip is skip
    assert committed_before(_txn(4, DIRECT), ROWS, on_record) is skip


def test_without_a_durable_identity_nothing_is_skipped() -> None:
    """A key of this run only: nothing on record is known to be this query's."""
    for on_record in (OnRecord.last_batch(4, ROWS), OnRecord.last_batch(9, ROWS)):
        assert not replay(_txn(4, DIRECT, durable=False), ROWS, on_record).skip
        assert not committed_before(_txn(4, DIRECT, durable=False), ROWS, on_record)


def test_phase_two_under_exactly_once_refuses_what_it_cannot_decide(
        caplog: pytest.LogCaptureFixture) -> None:
    decided = _txn(4)
    assert committed_before(decided, ROWS, OnRecord.last_batch(4, ROWS))
    assert committed_before(decided, None, OnRecord.last_batch(6, None)), "a later batch"
    assert not committed_before(decided, ROWS, OnRecord.last_batch(3, ROWS))
    with caplog.at_level(logging.WARNING, logger="sparkeos"):
        assert not committed_before(decided, ROWS, OnRecord.last_batch(4, OTHER))
    assert any("replay.nondeterministic" in r.getMessage() for r in caplog.records)
    for written, on_record in ((None, OnRecord.last_batch(4, ROWS)),
                               (ROWS, OnRecord.last_batch(4, None))):
        with pytest.raises(ReplayUndecidableError, match="cannot be compared"):
            committed_before(decided, written, on_record)
    # at-least-once writes what it cannot decide
    assert not committed_before(_txn(4, DIRECT), ROWS, OnRecord.last_batch(4, None))
    assert not committed_before(_txn(4, DIRECT), None, OnRecord.last_batch(4, ROWS))


def test_a_record_that_names_the_decided_transaction_is_its_commit() -> None:
    """A marker or PUBLISHED record without fingerprints (an earlier sparkeos) that
    names the decided attempt itself: committed, nothing to compare."""
    decided = _txn(4)
    assert committed_before(decided, None, OnRecord.last_batch(4, None, decided.txn_id))
    other = _txn(4, run=1)
    with pytest.raises(ReplayUndecidableError):
        committed_before(decided, None, OnRecord.last_batch(4, None, other.txn_id))
