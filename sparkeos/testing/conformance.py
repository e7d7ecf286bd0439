"""The connector conformance suite: the restart test every sink must pass.

Subclass ``ConnectorConformance`` in a test module and implement:

* ``sink_spec(workdir)``: ``{"factory": "module:callable", "kwargs": {...}}`` building
  your sink in the job's process (it must be importable there);
* ``visible_ids(workdir)``: every ``id`` a reader of your destination sees now,
  duplicates included;
* optionally ``sink_factory(workdir)`` (an in-process sink for the fast protocol
  tests) and ``plain_spec(workdir)`` (a plain foreachBatch writer, to show that the
  same crash duplicates without sparkeos).

Each crash-point test writes input for several batches, runs the streaming job in a
child process with a crash injected at one protocol point of one batch, checks the
crash happened and what is visible at that moment, restarts the job from its
checkpoint until the input is consumed, and asserts every id exactly once.
Cases a connector cannot support are marked ``pytest.mark.xfail(strict=True)`` in the
subclass, so an unexpected pass is reported too.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from typing import Any

import pytest

from sparkeos.core.commitlog import CommitLog, LocalStore
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.coordinator import Coordinator
from sparkeos.core.faults import ALL_POINTS, DRIVER_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.protocol import TransactionalSink

from .inprocess import ID_SCHEMA, ListRunner, id_batch, run_uncommitted
from .job import JobResult, JobSpec, load_factory, run_job_process, write_input

BEFORE_DECISION = ("after_begun", "after_all_prepared", "kill_driver_after_first_prepare")
AFTER_ALL_COMMITS = ("after_all_commits", "after_finished")
CRASH_BATCH = 1


def assert_exactly_once(visible: list[int], expected: list[int]) -> None:
    counts = Counter(visible)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(expected) - set(counts))
    unexpected = sorted(set(counts) - set(expected))
    assert not duplicates and not missing and not unexpected, (
        f"duplicates={duplicates[:20]} (total {len(duplicates)}), "
        f"missing={missing[:20]} (total {len(missing)}), unexpected={unexpected[:20]}"
    )


class ConnectorConformance:
    files = 3
    rows_per_file = 30
    partitions = 2

    # -- to implement --------------------------------------------------------------------
    def sink_spec(self, workdir: str) -> dict[str, Any]:
        raise NotImplementedError

    def visible_ids(self, workdir: str) -> list[int]:
        raise NotImplementedError

    def sink_factory(self, workdir: str) -> TransactionalSink[Any]:
        spec = self.sink_spec(workdir)
        return load_factory(spec["factory"])(**spec.get("kwargs", {}))  # type: ignore[no-any-return]

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return None

    # -- harness -----------------------------------------------------------------------------
    @pytest.fixture
    def workdir(self, tmp_path: Any) -> str:
        return str(tmp_path)

    def input_ids(self) -> list[list[int]]:
        return [list(range(f * 1000, f * 1000 + self.rows_per_file)) for f in range(self.files)]

    def job(self, workdir: str, mode: str = "exactly_once", master: str = "local[2]",
            sink: dict[str, Any] | None = None) -> JobSpec:
        return JobSpec(
            input=os.path.join(workdir, "input"),
            checkpoint=os.path.join(workdir, f"checkpoint-{mode}"),
            sink=sink or self.sink_spec(workdir),
            mode=mode, master=master, partitions=self.partitions,
            metrics_file=os.path.join(workdir, f"metrics-{mode}.json"),
        )

    def run(self, spec: JobSpec, fault: str | None = None) -> JobResult:
        return run_job_process(spec, fault)

    def run_to_completion(self, spec: JobSpec, restarts: int = 3) -> None:
        for _ in range(restarts):
            result = self.run(spec)
            if result.returncode == 0:
                return
        raise AssertionError(f"job did not complete after {restarts} restarts:\n{result.tail()}")

    def ids_of_batches(self, count: int) -> list[int]:
        """The ids of the first ``count`` batches, in order."""
        return [i for ids in self.input_ids()[:count] for i in ids]

    def prepare_input(self, workdir: str) -> list[int]:
        return write_input(os.path.join(workdir, "input"), self.input_ids())

    # -- the matrix --------------------------------------------------------------------------
    @pytest.mark.chaos
    @pytest.mark.parametrize("point", [*DRIVER_POINTS, "kill_driver_after_first_prepare"])
    def test_driver_crash_then_restart(self, workdir: str, point: str) -> None:
        expected = self.prepare_input(workdir)
        spec = self.job(workdir)
        crashed = self.run(spec, fault=f"{point}@{CRASH_BATCH}")
        assert crashed.crashed, f"fault {point} did not fire:\n{crashed.tail()}"
        if point in BEFORE_DECISION:
            # Invariant 1: nothing of the crashed batch is visible before its decision.
            before = self.ids_of_batches(CRASH_BATCH)
            assert sorted(self.visible_ids(workdir)) == sorted(before)
        if point in AFTER_ALL_COMMITS:
            # The crash really came after the commits: the batch is visible once.
            through = self.ids_of_batches(CRASH_BATCH + 1)
            assert sorted(self.visible_ids(workdir)) == sorted(through)
        self.run_to_completion(spec)
        assert_exactly_once(self.visible_ids(workdir), expected)

    @pytest.mark.chaos
    @pytest.mark.parametrize("point", ["task_fail_before_prepare", "task_fail_after_prepare"])
    def test_task_retry_reuses_the_transaction_id(self, workdir: str, point: str) -> None:
        expected = self.prepare_input(workdir)
        spec = self.job(workdir, master="local[2,2]")  # 2 attempts per task
        result = self.run(spec, fault=f"{point}@{CRASH_BATCH}")
        assert result.returncode == 0, result.tail()
        assert "Python worker exited unexpectedly" in result.stderr or "crashed" in (
            result.stderr), "the injected task failure did not happen"
        assert_exactly_once(self.visible_ids(workdir), expected)

    @pytest.mark.chaos
    def test_failed_task_without_retries_aborts_the_batch(self, workdir: str) -> None:
        expected = self.prepare_input(workdir)
        spec = self.job(workdir, master="local[2]")  # no task retries
        result = self.run(spec, fault=f"task_fail_after_prepare@{CRASH_BATCH}")
        assert result.returncode not in (0,), result.tail()
        assert "TransactionAbortedError" in result.stderr, result.tail()
        before = self.ids_of_batches(CRASH_BATCH)
        assert sorted(self.visible_ids(workdir)) == sorted(before)
        self.run_to_completion(spec)
        assert_exactly_once(self.visible_ids(workdir), expected)

    def test_end_to_end_several_batches(self, workdir: str) -> None:
        expected = self.prepare_input(workdir)
        spec = self.job(workdir)
        result = self.run(spec)
        assert result.returncode == 0, result.tail()
        assert_exactly_once(self.visible_ids(workdir), expected)
        # A restart with nothing new to read writes nothing.
        assert self.run(spec).returncode == 0
        assert_exactly_once(self.visible_ids(workdir), expected)

    @pytest.mark.chaos
    def test_plain_foreachbatch_duplicates_under_the_same_crash(self, workdir: str) -> None:
        plain = self.plain_spec(workdir)
        if plain is None:
            pytest.skip("connector gives no plain writer to compare with")
        expected = self.prepare_input(workdir)
        spec = self.job(workdir, mode="plain", sink=plain)
        crashed = self.run(spec, fault=f"after_finished@{CRASH_BATCH}")
        assert crashed.crashed, f"the plain job did not crash as planned:\n{crashed.tail()}"
        self.run_to_completion(spec)
        visible = self.visible_ids(workdir)
        assert set(visible) == set(expected)
        assert len(visible) > len(expected), "plain foreachBatch unexpectedly exactly-once"

    # -- protocol-level cases in process (no Spark) ---------------------------------------------
    def in_process_coordinator(self, workdir: str) -> tuple[TransactionalSink[Any], Coordinator]:
        sink = self.sink_factory(workdir)
        log = CommitLog(LocalStore(os.path.join(workdir, "inprocess-log")))
        return sink, Coordinator(sink, CoordinatorConfig(name="inproc"), log, "inprocessq")

    def test_zombie_attempt_never_becomes_visible(self, workdir: str) -> None:
        """Invariant 5: an earlier attempt still running after the new one began."""
        sink, coord = self.in_process_coordinator(workdir)
        sink.validate(ID_SCHEMA)
        zombie_txn = coord.pool.transaction(0, 0, "zombie-attempt")
        zombie = sink.begin(zombie_txn)
        sink.write(zombie, id_batch([999_999]))
        coord.run_batch(0, ListRunner([[1, 2], [3]]))
        try:
            sink.write(zombie, id_batch([999_998]))
            sink.prepare(zombie)  # may succeed (but is never decided) or be refused
        except Exception:
            pass
        coord.run_batch(1, ListRunner([[4], [5]]))
        coord.run_batch(2, ListRunner([[6], [7]]))  # reuses the zombie's slot
        assert_exactly_once(self.visible_ids(workdir), [1, 2, 3, 4, 5, 6, 7])

    @pytest.mark.parametrize("point", ALL_POINTS)
    def test_in_process_crash_matrix(self, workdir: str, point: str) -> None:
        """Every crash point, simulated in process against the real destination."""
        sink, coord = self.in_process_coordinator(workdir)
        plan = [[[1, 2], [3]], [[4], [5, 6]], [[7], [8]]]
        spark_committed: list[int] = []
        for faults in (FaultPlan(point, 1, simulate=True), None):
            coord = Coordinator(sink, CoordinatorConfig(name="inproc"), coord.log, "inprocessq",
                                faults)
            with contextlib.suppress(InjectedCrash):  # the process died; restart it
                run_uncommitted(coord, plan, spark_committed)
        assert_exactly_once(self.visible_ids(workdir), list(range(1, 9)))

    def test_commit_is_idempotent(self, workdir: str) -> None:
        sink, coord = self.in_process_coordinator(workdir)
        coord.run_batch(0, ListRunner([[1], [2]]))
        state = coord.states()[0]
        assert state.decided is not None
        for participant in state.decided["participants"]:
            txn = coord.pool.transaction(0, int(participant["partition"]),
                                         str(participant["attempt"]))
            sink.commit(txn, participant["receipt"])
            sink.rollback(coord.pool.transaction(5, int(participant["partition"])))
        assert_exactly_once(self.visible_ids(workdir), [1, 2])
