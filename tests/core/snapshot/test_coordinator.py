"""The exactly-once protocol with an in-memory participant: one test per invariant."""

from __future__ import annotations

import pytest

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import (
    CommitLogError,
    ConfigurationError,
    SchemaMismatchError,
    TransactionAbortedError,
)
from sparkeos.core.faults import DRIVER_POINTS, TASK_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import LocalStore
from sparkeos.testing.inprocess import run_uncommitted
from tests.support.memory import (
    ListRunner,
    MemorySink,
    MemoryStore,
    MemorySystem,
    TaskCommitMemorySink,
    id_batch,
)

BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8, 9], []], [[10], [11]]]
ALL_IDS = list(range(1, 12))


def coordinator(system: MemorySystem, log: CommitLog, faults: FaultPlan | None = None,
                guarantee: Guarantee = Guarantee.EXACTLY_ONCE,
                sink_class: type[MemorySink] = MemorySink) -> Coordinator:
    config = CoordinatorConfig(name="mem", guarantee=guarantee)
    return Coordinator(sink_class(system), config, log, "q1", faults)


def run_query(system: MemorySystem, log: CommitLog, faults: FaultPlan | None,
              spark_committed: list[int], sink_class: type[MemorySink] = MemorySink) -> None:
    run_uncommitted(coordinator(system, log, faults, sink_class=sink_class), BATCHES,
                    spark_committed)


def test_happy_path_writes_every_row_once(tmp_path):
    system, log = MemorySystem(), CommitLog(LocalStore(str(tmp_path)))
    run_query(system, log, None, [])
    assert sorted(system.visible) == ALL_IDS
    states = log.batches()
    assert [s.status for s in states.values()] == ["finished"] * 4
    assert not system.prepared


@pytest.mark.parametrize("sink_class", [MemorySink, TaskCommitMemorySink])
@pytest.mark.parametrize("point", DRIVER_POINTS + TASK_POINTS)
@pytest.mark.parametrize("crash_batch", [0, 2])
def test_crash_at_every_point_then_restart(point, crash_batch, sink_class):
    system, log, committed = MemorySystem(), CommitLog(MemoryStore()), []
    faults = FaultPlan(point, crash_batch, simulate=True)
    crashed = False
    try:
        run_query(system, log, faults, committed, sink_class)
    except InjectedCrash:
        crashed = True
    # Every point fires (task-failure points are retried, so they do not crash).
    assert crashed or point.startswith("task_fail"), f"{point} never fired"
    run_query(system, log, None, committed, sink_class)
    assert sorted(system.visible) == ALL_IDS, point
    assert not system.prepared


def test_nothing_visible_before_decided():
    """Invariant 1: a crash after every task prepared but before decided shows nothing."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        run_query(system, log, FaultPlan("after_all_prepared", 0, simulate=True), [])
    assert system.visible == []
    assert len(system.prepared) == 2


def test_decided_batch_is_committed_on_restart_not_rewritten():
    """Invariants 2 and 3: decided means committed later; the re-run writes nothing."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        run_query(system, log, FaultPlan("after_decided", 0, simulate=True), [])
    assert system.visible == []
    coord = coordinator(system, log)
    replay = ListRunner([[100], [200]])  # different data: must be ignored
    metrics = coord.run_batch(0, replay)
    assert metrics.outcome == "replayed"
    assert sorted(system.visible) == [1, 2, 3]
    # ... but the batch's plan still runs (a stateful query's state stores must commit).
    assert replay.ran_without_output
    assert metrics.recovered == [{"batch_id": 0, "action": "committed"}]


def test_rerun_before_decided_rolls_back_first():
    """Invariant 4: prepared leftovers of the earlier attempt are rolled back."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        run_query(system, log, FaultPlan("kill_driver_after_first_prepare", 1, simulate=True), [])
    assert len(system.prepared) == 1  # partition 0 of batch 1 prepared, then the crash
    metrics = coordinator(system, log).run_batch(1, ListRunner(BATCHES[1]))
    assert metrics.recovered == [{"batch_id": 1, "action": "rolled_back"}]
    assert sorted(system.visible) == [1, 2, 3, 4, 5, 6]
    attempts = log.batches()[1]
    assert sorted(attempts.begun) == [0, 1] and attempts.aborted == {0}
    assert attempts.decided_run == 1 and not system.prepared


def test_task_retry_fences_the_failed_attempt():
    """Invariant 5: a retried task reuses the ID; the earlier attempt cannot commit."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = coordinator(system, log, FaultPlan("task_fail_after_prepare", 0, simulate=True))
    coord.run_batch(0, ListRunner([[1, 2], [3]], max_attempts=2))
    assert sorted(system.visible) == [1, 2, 3]
    decided = log.batches()[0].decided
    assert decided is not None and decided["participants"][0]["attempt"] == "b0r0a1"
    assert not system.prepared and not system.open


def test_zombie_writes_never_commit():
    """Invariant 5: a zombie attempt of the batch (its own ID) is swept after the
    decision; its later writes fail and nothing of it becomes visible."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    sink = MemorySink(system)
    coord = coordinator(system, log)
    zombie = sink.begin(coord.pool.transaction(0, 0, run=0, tag=5))
    sink.write(zombie, id_batch([99]))
    coord.run_batch(0, ListRunner([[1], [2]]))
    with pytest.raises(RuntimeError, match="fenced"):
        sink.write(zombie, id_batch([98]))
    assert sorted(system.visible) == [1, 2] and not system.open


def test_transaction_ids_are_deterministic_and_bounded():
    """Invariants 6 and 8: IDs are functions of (query, sink, partition, slot) plus the
    attempt; the participant IDs (what Kafka's transactional.id uses) are two per
    participant; every attempt ID of a run is covered by its begun record."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    run_query(system, log, None, [])
    coord = coordinator(system, log)
    decided = {s.batch_id: s.decided for s in log.batches().values()}
    participants = {coord.pool.transaction(b, int(p["partition"]), 0, int(p["tag"])
                                           ).participant_id
                    for b, d in decided.items() if d for p in d["participants"]}
    assert participants == {"seos-q1-mem-p0-s0", "seos-q1-mem-p1-s0",
                            "seos-q1-mem-p0-s1", "seos-q1-mem-p1-s1"}
    txn = coord.pool.transaction(3, 1, run=2, tag=9)
    assert txn.txn_id == "seos-q1-mem-p1-s1-b3r2a9" and txn.attempt == "b3r2a9"
    assert coord.pool.parse(txn.txn_id) == txn
    assert coord.pool.parse("seos-q1-mem-other-p1-s1-b3r2a9") is None
    assert log.batches()[3].begun[0]["tags"] == 8


def test_parallelism_change_between_runs_is_recovered_from_the_log():
    """Invariant 7: the re-run has 3 partitions; the 2 old IDs come from the log."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    with pytest.raises(InjectedCrash):
        coordinator(system, log, FaultPlan("after_all_prepared", 0, simulate=True)).run_batch(
            0, ListRunner([[1, 2], [3]]))
    coordinator(system, log).run_batch(0, ListRunner([[1], [2], [3]]))
    assert sorted(system.visible) == [1, 2, 3]
    assert not system.prepared


def test_failed_phase_one_rolls_back_and_raises_typed_error():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = coordinator(system, log, FaultPlan("task_fail_before_prepare", 0, simulate=True))
    with pytest.raises(TransactionAbortedError, match="batch=0") as info:
        coord.run_batch(0, ListRunner([[1], [2]], max_attempts=1))
    assert "restart the query" in str(info.value)
    assert system.visible == [] and not system.prepared
    coordinator(system, log).run_batch(0, ListRunner([[1], [2]]))
    assert sorted(system.visible) == [1, 2]


def test_slot_still_held_is_refused():
    from sparkeos.core.snapshot.txpool import TransactionPool

    with pytest.raises(CommitLogError, match="slot 0 is still held by unfinished batch 2"):
        TransactionPool("q", "s").check_slot_free(4, [2, 3])


def test_schema_change_between_batches_is_refused_before_writing():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = coordinator(system, log)
    coord.run_batch(0, ListRunner([[1]]))
    runner = ListRunner([[2]])
    import pyarrow as pa

    runner.schema = pa.schema([("id", pa.string())])
    with pytest.raises(SchemaMismatchError, match="id:int64->string"):
        coord.run_batch(1, runner)
    assert 1 not in log.batches()
    assert log.last_error()["type"] == "SchemaMismatchError"


class RefusingSink(MemorySink):
    """Refuses batches whose id column is not int64 (as a real sink's validate does)."""

    def validate(self, schema):
        import pyarrow as pa

        if schema.field("id").type != pa.int64():
            raise SchemaMismatchError("id must be bigint")


def test_a_refused_batch_pins_no_schema():
    """Bug 5: validate runs first and the schema is recorded only once a batch is
    decided, so the corrected query is not refused as a schema change."""
    import pyarrow as pa

    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = Coordinator(RefusingSink(system), CoordinatorConfig(name="mem"), log, "q1")
    wrong = ListRunner([[1]])
    wrong.schema = pa.schema([("id", pa.string())])
    with pytest.raises(SchemaMismatchError, match="must be bigint"):
        coord.run_batch(0, wrong)
    assert "schema" not in (log.read_meta() or {})
    coord = Coordinator(RefusingSink(system), CoordinatorConfig(name="mem"), log, "q1")
    coord.run_batch(0, ListRunner([[1]]))
    assert system.visible == [1]
    assert log.read_meta()["schema"] == [["id", "int64"], ["payload", "string"]]


def test_exactly_once_without_log_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="checkpointLocation"):
        Coordinator(MemorySink(MemorySystem()), CoordinatorConfig(name="m"), None, "q")


def test_at_least_once_commits_in_tasks_without_a_log():
    """No commit log: each task commits at once. A replay is written again unless the
    sink itself skips partitions it committed (the memory sink's marker does)."""
    system = MemorySystem()
    coord = coordinator(system, None, guarantee=Guarantee.AT_LEAST_ONCE)  # type: ignore[arg-type]
    metrics = coord.run_batch(0, ListRunner([[1], [2]]))
    assert metrics.outcome == "direct" and sorted(system.visible) == [1, 2]
    coord.run_batch(0, ListRunner([[1], [2]]))
    assert sorted(system.visible) == [1, 2] and system.commits == 2


def test_at_least_once_replay_never_reuses_an_id_of_an_earlier_run():
    """Issue 23, item 2: a task killed mid-write leaves its claim behind; the restarted
    query replays the batch first, and with the IDs of the run before it was fenced on
    every restart. Each query run's IDs are its own now."""
    system = MemorySystem()
    first = coordinator(system, None, guarantee=Guarantee.AT_LEAST_ONCE)  # type: ignore[arg-type]
    first.run_batch(0, ListRunner([[1], [2]]))
    killed = first.pool.transaction(1, 0, first._direct_run, 0)
    MemorySink(system).write(MemorySink(system).begin(killed), id_batch([3]))  # then kill -9
    restarted = coordinator(system, None, guarantee=Guarantee.AT_LEAST_ONCE)  # type: ignore[arg-type]
    assert restarted._direct_run != first._direct_run
    restarted.run_batch(1, ListRunner([[3], [4]]))
    assert sorted(system.visible) == [1, 2, 3, 4]


def test_old_records_are_purged():
    system, log = MemorySystem(), CommitLog(MemoryStore())
    coord = Coordinator(MemorySink(system), CoordinatorConfig(name="mem", retain_batches=3),
                        log, "q1")
    for b in range(10):
        coord.run_batch(b, ListRunner([[b]]))
    assert sorted(log.batches()) == [6, 7, 8, 9]


def test_recover_racing_the_driver_cannot_abort_what_it_decides():
    """Bug 3: `sparkeos recover --force` (or a second driver) aborts run 0 of batch 0
    while the live driver is in phase 1. One outcome per run: the driver's decision
    loses, raises, and nothing of the run is committed; the restart writes it once."""
    system, log = MemorySystem(), CommitLog(MemoryStore())
    live = coordinator(system, log)

    class RacedRunner(ListRunner):
        def run_tasks(self, task):
            results = super().run_tasks(task)
            coordinator(system, log).recover()  # the racing recover, on its own cache
            return results

    with pytest.raises(TransactionAbortedError, match="recorded as aborted by another"):
        live.run_batch(0, RacedRunner([[1, 2], [3]]))
    assert system.visible == [] and not system.prepared
    assert log.batches()[0].aborted == {0}
    coordinator(system, log).run_batch(0, ListRunner([[1, 2], [3]]))
    assert sorted(system.visible) == [1, 2, 3]


def test_a_destination_is_pinned_only_once_a_batch_is_decided(tmp_path):
    """Issue 15, defect 2: a first batch that failed against a wrong destination once
    bound the sink name to it for ever; now it binds only once a batch is decided."""
    from sparkeos.connectors.file import FileSink, read_output
    from sparkeos.core.errors import TransactionIdCollisionError
    from sparkeos.core.streaming.adapter import ForeachBatchAdapter

    log = CommitLog(LocalStore(str(tmp_path / "log")))
    config = CoordinatorConfig(name="files")
    wrong, right, other = (str(tmp_path / n) for n in ("wrong", "right", "other"))
    (tmp_path / "wrong").write_text("a file where the directory should be")
    key = ForeachBatchAdapter(FileSink(wrong), config)._claim_log(log, "q")
    with pytest.raises(ConfigurationError, match="not writable"):
        Coordinator(FileSink(wrong), config, log, key).run_batch(0, ListRunner([[1]]))
    key = ForeachBatchAdapter(FileSink(right), config)._claim_log(log, "q")  # the fix
    Coordinator(FileSink(right), config, log, key).run_batch(0, ListRunner([[1]]))
    assert read_output(right).column("id").to_pylist() == [1]
    with pytest.raises(TransactionIdCollisionError, match="another identity"):
        ForeachBatchAdapter(FileSink(other), config)._claim_log(log, "q")


class _BoundedRunner(ListRunner):
    """Plans an upper bound of partitions, as the Spark runner's coalesce does."""

    def __init__(self, partitions: list[list[int]], bound: int,
                 ran: list[int] | None = None) -> None:
        super().__init__(partitions)
        self.bound, self.ran = bound, ran

    def partitions(self) -> int:
        return self.bound

    def run_tasks(self, task):  # type: ignore[no-untyped-def]
        results = super().run_tasks(task)
        return results if self.ran is None else [results[i] for i in self.ran]


def test_fewer_partitions_than_planned_commit_the_ones_that_ran(tmp_path):
    system, log = MemorySystem(), CommitLog(LocalStore(str(tmp_path)))
    coord = coordinator(system, log)
    metrics = coord.run_batch(0, _BoundedRunner([[1, 2], [3]], bound=4))
    assert sorted(system.visible) == [1, 2, 3] and metrics.partitions == 2
    state = log.batches()[0]
    assert state.begun[0]["partitions"] == 4  # every ID that may exist is on record
    assert [p["partition"] for p in state.decided["participants"]] == [0, 1]


def test_a_gap_in_the_partitions_that_ran_aborts_the_batch(tmp_path):
    system, log = MemorySystem(), CommitLog(LocalStore(str(tmp_path)))
    coord = coordinator(system, log)
    with pytest.raises(TransactionAbortedError, match="calls for"):
        coord.run_batch(0, _BoundedRunner([[1], [2], [3]], bound=4, ran=[0, 2]))
    assert system.visible == [] and not system.prepared
    coord.run_batch(0, _BoundedRunner([[1], [2], [3]], bound=4))
    assert sorted(system.visible) == [1, 2, 3]
