"""``overlap_commits``: a batch's phase 2 beside the next batch's phase 1."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import RetriableError, SparkStoppedError
from sparkeos.core.faults import DRIVER_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.observe import BatchMetrics
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.overlap import CommitsInFlight, Running, Starter, start_thread
from tests.support.memory import (
    ListRunner,
    MemorySink,
    MemoryStore,
    MemorySystem,
    TaskCommitMemorySink,
)

BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8, 9], []], [[10], [11]]]
ALL_IDS = list(range(1, 12))


class Held:
    """A ``Starter`` that runs the background work only when it is awaited: every
    step of the overlap happens where the test can see it."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def __call__(self, name: str, work: Callable[[], None]) -> Running:
        self.started.append(name)
        return _HeldRun(work)


class _HeldRun:
    def __init__(self, work: Callable[[], None]) -> None:
        self.work = work
        self.ran = False

    def done(self) -> bool:
        return self.ran

    def wait(self) -> None:
        if not self.ran:
            self.ran = True
            self.work()

    def is_current(self) -> bool:
        return False


def overlapping(system: MemorySystem, log: CommitLog, background: Starter = start_thread,
                faults: FaultPlan | None = None,
                sink: MemorySink | None = None) -> Coordinator:
    config = CoordinatorConfig(name="mem", overlap_commits=True)
    return Coordinator(sink or MemorySink(system), config, log, "q1", faults,
                       background=background)


def test_a_batch_returns_decided_and_commits_beside_the_next_one():
    system, log, held = MemorySystem(), CommitLog(MemoryStore()), Held()
    coord = overlapping(system, log, held)
    done: list[BatchMetrics] = []
    first = coord.run_batch(0, ListRunner(BATCHES[0]), on_complete=done.append)
    assert first.outcome == "decided" and system.visible == [] and done == []
    assert log.batches()[0].needs_commit
    # Batch 1's phase 1 runs while batch 0 is still to be committed; batch 0's phase 2
    # ends before batch 1's starts (records visible in batch order).
    second = coord.run_batch(1, ListRunner(BATCHES[1]), on_complete=done.append)
    assert sorted(system.visible) == [1, 2, 3] and len(system.prepared) == 2
    assert [m.batch_id for m in done] == [0] and done[0].outcome == "committed"
    assert done[0].visible_ms >= done[0].total_ms > 0
    assert second.outcome == "decided"
    coord.flush()
    assert sorted(system.visible) == [1, 2, 3, 4, 5, 6] and not system.prepared
    assert [m.batch_id for m in done] == [0, 1]
    assert held.started == ["sparkeos-commit-mem-0", "sparkeos-commit-mem-1"]
    assert all(s.status == "finished" for s in log.batches().values())


def test_a_batch_on_the_slot_of_one_still_committing_waits_for_it():
    """Batch 2 reuses batch 0's slot: after an empty batch 1 (which waited for nothing),
    it waits for batch 0's phase 2 instead of finding the slot held."""
    system, log, held = MemorySystem(), CommitLog(MemoryStore()), Held()
    coord = overlapping(system, log, held)
    coord.run_batch(0, ListRunner(BATCHES[0]))
    assert coord.run_batch(1, ListRunner([])).outcome == "committed"
    assert system.visible == []
    third = coord.run_batch(2, ListRunner(BATCHES[2]))
    assert sorted(system.visible) == [1, 2, 3] and third.wait_ms >= 0
    coord.flush()
    assert sorted(system.visible) == [1, 2, 3, 7, 8, 9]


class FailingOnce(MemorySink):
    """A destination that fails batch 0's first commit (unreachable for a moment)."""

    def __init__(self, system: MemorySystem) -> None:
        super().__init__(system)
        self.failed = False

    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if txn.batch_id == 0 and not self.failed:
            self.failed = True
            raise ConnectionError("destination unreachable")
        super().commit(txn, receipt)


def test_a_failed_background_commit_stops_the_next_batch_and_is_not_lost():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = overlapping(system, log, Held(), sink=FailingOnce(system))
    coord.run_batch(0, ListRunner(BATCHES[0]))
    with pytest.raises(RetriableError) as raised:
        coord.run_batch(1, ListRunner(BATCHES[1]))
    assert "phase 2 (commit) failed" in raised.value.problem
    assert raised.value.batch_id == 0 and "destination unreachable" in raised.value.problem
    # Both batches stay decided; the restarted query commits them before anything else.
    states = log.batches()
    assert states[0].needs_commit and states[1].needs_commit
    restarted = overlapping(system, log, Held())
    metrics = restarted.run_batch(2, ListRunner(BATCHES[2]))
    assert [r["batch_id"] for r in metrics.recovered] == [0, 1]
    restarted.flush()
    assert sorted(system.visible) == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_a_failure_an_outside_wait_raised_still_stops_the_query():
    """``processAllAvailable()`` (or another thread's ``flush()``) meets batch 0's failed
    background commit first: it raises the failure, once, and the query's next batch
    raises it too instead of committing past batch 0 (records stay in batch order)."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = overlapping(system, log, Held(), sink=FailingOnce(system))
    coord.run_batch(0, ListRunner(BATCHES[0]))
    with pytest.raises(RetriableError):
        coord.flush()
    coord.flush()  # raised once to waiters outside the query
    with pytest.raises(RetriableError) as raised:
        coord.run_batch(1, ListRunner(BATCHES[1]))
    assert raised.value.batch_id == 0
    assert not set(system.visible) & {4, 5, 6} and 1 not in log.batches()


def test_a_metrics_callback_may_flush_from_the_commit_thread():
    """With overlap the metrics callback runs on the commit thread: a ``flush()`` there
    (``processAllAvailable()`` from a callback) returns, its batch committed."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = overlapping(system, log)
    seen: list[int] = []

    def on_complete(metrics: BatchMetrics) -> None:
        coord.flush()
        seen.append(metrics.batch_id)

    for batch_id in (0, 1):
        coord.run_batch(batch_id, ListRunner(BATCHES[batch_id]), on_complete=on_complete)
    coord.flush()
    assert seen == [0, 1] and sorted(system.visible) == [1, 2, 3, 4, 5, 6]


def test_flush_raises_the_failure_of_the_last_batch():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = overlapping(system, log, sink=FailingOnce(system))
    coord.run_batch(0, ListRunner(BATCHES[0]))
    with pytest.raises(RetriableError):
        coord.flush()
    coord.flush()  # raised once: nothing left in flight


class _StoppedUnderTheCommit(ListRunner):
    """Spark's context stops while phase 2 runs in tasks (the script's ``spark.stop()``
    or the application's end): the first participant's task committed, then the job
    fails."""

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        fn(items[0])
        raise SparkStoppedError("Spark's context stopped", fix="restart the query")


def test_a_commit_spark_stops_under_finishes_in_the_driver_process():
    """A sink that commits in tasks: when Spark stops under its background commit, the
    commit finishes in this process, as recovery does (once per participant)."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = overlapping(system, log, Held(), sink=TaskCommitMemorySink(system))
    coord.run_batch(0, _StoppedUnderTheCommit(BATCHES[0]))
    coord.flush()
    assert sorted(system.visible) == [1, 2, 3] and not system.prepared
    assert log.batches()[0].status == "finished"


class _Gate:
    """A ``Running`` whose ``wait`` returns at once in the thread that made it, and in
    any other thread only once ``open`` is set; ``done`` once some thread waited."""

    def __init__(self) -> None:
        self.owner = threading.current_thread()
        self.open = threading.Event()
        self.waited = False

    def done(self) -> bool:
        return self.waited

    def wait(self) -> None:
        if threading.current_thread() is not self.owner:
            self.open.wait()
        self.waited = True

    def is_current(self) -> bool:
        return False


def test_a_wait_from_another_thread_never_forgets_the_next_batch():
    """The end of a query waits for the batch in flight from its own thread
    (``core.streaming.ending``) while the query's thread waits for it too and starts the next
    batch: the late waiter leaves the next batch in flight."""
    gates: list[_Gate] = []

    def gated(name: str, work: Callable[[], None]) -> Running:
        work()
        gates.append(_Gate())
        return gates[-1]

    flight = CommitsInFlight(gated)
    flight.start(0, lambda: None, "b0", {})
    ending = threading.Thread(target=flight.wait)
    ending.start()  # waits for batch 0 until its gate opens
    flight.wait()  # the query's thread: batch 0 ended
    flight.start(1, lambda: None, "b1", {"": 1})
    gates[0].open.set()
    ending.join()
    assert flight.busy == frozenset({1}) and flight.held == {"": 1}


@pytest.mark.parametrize("point", DRIVER_POINTS)
@pytest.mark.parametrize("crash_batch", [0, 3])
def test_crash_at_every_point_with_a_batch_in_flight_then_restart(point, crash_batch):
    """The driver dies at each point, phase 2 running on a thread beside the next
    batch (for the last batch, beside nothing: the process ends); Spark counts every
    batch that returned as done. The restarted query loses and duplicates nothing.

    A batch Spark counts as done is not run again: its commits are finished by the
    restarted query's next batch (here one more, of new input), as recovery does."""
    system, log, spark_committed = MemorySystem(), CommitLog(MemoryStore()), []
    faults = FaultPlan(point, crash_batch, simulate=True)

    def run(faults: FaultPlan | None, plan: list[list[list[int]]]) -> None:
        coord = overlapping(system, log, faults=faults)
        try:
            for batch_id, partitions in enumerate(plan):
                if batch_id not in spark_committed:
                    coord.run_batch(batch_id, ListRunner(partitions))
                    spark_committed.append(batch_id)
        finally:
            coord.flush()  # the process ends only when its commit thread has

    with pytest.raises(InjectedCrash):
        run(faults, BATCHES)
    run(None, [*BATCHES, [[12]]])
    assert sorted(system.visible) == [*ALL_IDS, 12], point
    assert not system.prepared


class Counting(MemorySink):
    def __init__(self, system: MemorySystem) -> None:
        super().__init__(system)
        self.asked: list[int] = []

    def check_participants(self, count: int) -> None:
        self.asked.append(count)


def test_a_sink_is_asked_for_the_transactions_open_at_once():
    """A destination with a limit on open transactions (PostgreSQL's prepared ones)
    counts those of the batch still committing beside the next."""
    system, log, held = MemorySystem(), CommitLog(MemoryStore()), Held()
    sink = Counting(system)
    coord = overlapping(system, log, held, sink=sink)
    coord.run_batch(0, ListRunner(BATCHES[0]))
    coord.run_batch(1, ListRunner(BATCHES[1]))
    assert sink.asked == [2, 4]
    coord.flush()


def test_overlap_commits_must_be_a_boolean():
    from sparkeos.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="overlap_commits"):
        CoordinatorConfig(name="mem", overlap_commits="yes")  # type: ignore[arg-type]


# -- the start hook (core/streaming/onstart.py) ----------------------------------------------------
class _OtherDestination(MemorySink):
    def identity(self) -> dict[str, str]:
        return {"table": "another"}


def _decided_not_committed(tmp_path, system: MemorySystem, query: str) -> CommitLog:
    """Batch 0 of ``query`` decided under a checkpoint in ``tmp_path``, its background
    commit never run (a crash): what a restart without new input meets."""
    from sparkeos.core.snapshot.commitlog import sink_log_location
    from sparkeos.core.storage.logstores import open_store
    from sparkeos.core.streaming.queryrun import claim_log

    log = CommitLog(open_store(sink_log_location(str(tmp_path), "mem")))
    sink = MemorySink(system)
    claim_log(log, query, sink, "mem")
    Coordinator(sink, CoordinatorConfig(name="mem", overlap_commits=True), log,
                str(log.read_meta()["query_key"]), None, background=Held()
                ).run_batch(0, ListRunner(BATCHES[0]))
    assert log.batches()[0].needs_commit and system.visible == []
    return log


def test_a_query_start_commits_what_its_crash_left_decided(tmp_path):
    from sparkeos.core.streaming.onstart import finish_decided

    system = MemorySystem()
    log = _decided_not_committed(tmp_path, system, "query-1")
    config = CoordinatorConfig(name="mem", overlap_commits=True,
                               checkpoint_location=str(tmp_path))
    assert finish_decided(None, MemorySink(system), config, "query-1") == [0]
    assert sorted(system.visible) == [1, 2, 3] and not system.prepared
    assert log.batches()[0].status == "finished"
    assert finish_decided(None, MemorySink(system), config, "query-1") == []  # once


def test_a_query_start_leaves_another_querys_or_destinations_log_alone(tmp_path):
    from sparkeos.core.streaming.onstart import finish_decided

    system = MemorySystem()
    log = _decided_not_committed(tmp_path, system, "query-1")
    config = CoordinatorConfig(name="mem", overlap_commits=True,
                               checkpoint_location=str(tmp_path))
    assert finish_decided(None, MemorySink(system), config, "query-2") == []
    assert finish_decided(None, _OtherDestination(system), config, "query-1") == []
    assert finish_decided(None, MemorySink(system), CoordinatorConfig(
        name="other", checkpoint_location=str(tmp_path)), "query-1") == []
    assert system.visible == [] and log.batches()[0].needs_commit
