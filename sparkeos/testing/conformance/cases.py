"""``ConnectorConformance``, the restart test every sink must pass (how to use it: the
package's docstring). It inherits the cases beside a commit from ``races`` and those of
replays from ``replays``; ``variants`` holds the classes that run a part of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import ConfigurationError, DataLossError, TransactionAbortedError
from sparkeos.core.faults import (
    AFTER_FIRST_COMMIT_SIGNAL,
    ALL_POINTS,
    BARRIER_ENV,
    COUNTED_POINT,
    DRIVER_POINTS,
    FaultPlan,
    InjectedCrash,
    InjectedTaskFailure,
)
from sparkeos.core.protocol import Transaction, TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog, Store, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import LocalStore, open_store

from ..inprocess import ID_SCHEMA, ArrowRunner, ListRunner, id_batch, run_uncommitted
from ..job import JobResult, JobSpec, load_factory, run_job, run_job_process, write_input
from .races import RaceCases
from .replays import ReplayCases
from .support import (
    CRASH_BATCH,
    OVERLAP_POINTS,
    REPLAY_RULE,
    SPECULATION_CONF,
    assert_exactly_once,
    assert_visible_after_kill,
)


def overlapping(spec: JobSpec) -> JobSpec:
    """``spec`` with ``overlap_commits`` on (the test jobs turn it off by default: the
    kill matrix reads what is visible right after a kill)."""
    return dataclasses.replace(spec, settings={**spec.settings, "overlap_commits": True})


class ConnectorConformance(RaceCases, ReplayCases):
    files = 3
    rows_per_file = 30
    partitions = 2
    connect = False
    """Run the Spark jobs through Spark Connect (see ``ConnectConformance``)."""
    route = "foreachBatch"
    """``"format"``: run the Spark jobs through the sink's format (``FormatConformance``)."""

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

    def leftovers(self, workdir: str) -> list[str] | None:
        """Prepared or staged state of this test's attempts still in the destination
        (None: the connector cannot tell; the checks are then skipped)."""
        return None

    def assert_no_leftovers(self, workdir: str) -> None:
        left = self.leftovers(workdir)
        assert not left, f"attempts that never committed left state behind: {left}"

    # -- harness -----------------------------------------------------------------------------
    @pytest.fixture
    def workdir(self, tmp_path: Any) -> str:
        return str(tmp_path)

    def input_ids(self, files: int | None = None) -> list[list[int]]:
        count = self.files if files is None else files
        return [list(range(f * 1000, f * 1000 + self.rows_per_file)) for f in range(count)]

    def job(self, workdir: str, mode: str = "exactly_once", master: str = "local[2]",
            sink: dict[str, Any] | None = None,
            spark_conf: dict[str, str] | None = None) -> JobSpec:
        return JobSpec(
            input=os.path.join(workdir, "input"),
            checkpoint=os.path.join(workdir, f"checkpoint-{mode}"),
            sink=sink or (self.format_spec(workdir) if self.route == "format"
                          else self.sink_spec(workdir)),
            mode=mode, master=master, partitions=self.partitions,
            metrics_file=os.path.join(workdir, f"metrics-{mode}.json"),
            spark_conf=dict(spark_conf or {}), connect=self.connect, route=self.route,
        )

    def format_spec(self, workdir: str) -> dict[str, Any]:
        """``{"format": "sparkeos-...", "options": {...}}``: the sink as its Spark format
        writes to the destination ``sink_spec`` names (``FormatConformance``)."""
        raise NotImplementedError

    def run(self, spec: JobSpec, fault: str | None = None,
            env: dict[str, str] | None = None, barrier: str | None = None) -> JobResult:
        """A run that something kills, or with settings of its own (``env``), in a job
        process of its own; else in the warm session (``sparkeos.testing.job.run_job``).
        ``barrier``: the fault's signal directory (it needs no process of its own)."""
        if env:
            return run_job_process(spec, fault, env=env, barrier=barrier)
        return run_job(spec, fault, barrier=barrier)

    def run_to_completion(self, spec: JobSpec, restarts: int = 3) -> None:
        for _ in range(restarts):
            result = self.run(spec)
            if result.returncode == 0:
                return
        raise AssertionError(f"job did not complete after {restarts} restarts:\n{result.tail()}")

    def ids_of_batches(self, count: int) -> list[int]:
        """The ids of the first ``count`` batches, in order."""
        return [i for ids in self.input_ids(count) for i in ids]

    def prepare_input(self, workdir: str, files: int | None = None) -> list[int]:
        """One input file per batch: ``files`` of them (default ``self.files``)."""
        return write_input(os.path.join(workdir, "input"), self.input_ids(files))

    # -- the matrix --------------------------------------------------------------------------
    driver_kill_points: tuple[str, ...] = (*DRIVER_POINTS, "kill_driver_after_first_prepare")
    """Where ``test_driver_crash_then_restart`` kills the driver, one point per batch."""
    background_kill_points: frozenset[str] = frozenset()
    """Of ``driver_kill_points``, the last may run with ``overlap_commits`` on: its kill
    lands in a commit running in the background beside the next batch."""
    abort_after_kills = True
    """Whether ``test_driver_crash_then_restart`` ends with a batch whose task fails
    without retries (the batch is aborted; the next run writes it)."""

    @pytest.mark.chaos
    def test_driver_crash_then_restart(self, workdir: str) -> None:
        """The driver is killed (kill -9) at each of ``driver_kill_points`` in turn: the
        first run dies at the first point in batch 1, its restart recovers batch 1 and
        dies at the second point in batch 2, and so on. After each kill the reader sees
        every earlier batch exactly once, nothing of the killed batch before its
        decision, all of it after its commits. Then a task of the next batch fails with
        no retries left: the batch is aborted, none of it visible, the query fails with
        ``TransactionAbortedError``. The last restart runs to the end: every id exactly
        once."""
        points = self.driver_kill_points
        background = self.background_kill_points  # phase 2's, last: a batch may take 2 files
        assert background <= set(OVERLAP_POINTS) and set(points[-1:]) >= background
        aborted = CRASH_BATCH + len(points)
        expected = self.prepare_input(workdir, files=aborted + 2)
        spec = self.job(workdir)  # local[2]: no task retries
        for batch_id, point in enumerate(points, start=CRASH_BATCH):
            crashed = self.run(overlapping(spec) if point in background else spec,
                               fault=f"{point}@{batch_id}")
            assert crashed.crashed, f"fault {point}@{batch_id} did not fire:\n{crashed.tail()}"
            assert_visible_after_kill(self.visible_ids(workdir), point,
                                      self.ids_of_batches(batch_id),
                                      self.ids_of_batches(batch_id + 1))
        if self.abort_after_kills:
            assert not background, "the aborted batch's number assumes one file per batch"
            failed = self.run(spec, fault=f"task_fail_after_prepare@{aborted}")
            assert failed.returncode != 0, failed.tail()
            if self.route == "format":  # Spark's own error; the abort is on record
                log = CommitLog(open_store(sink_log_location(spec.checkpoint, spec.name)))
                state = log.batches()[aborted]
                assert state.aborted and not state.open_runs, (state, failed.tail())
            else:
                assert "TransactionAbortedError" in failed.stderr, failed.tail()
            assert_exactly_once(self.visible_ids(workdir), self.ids_of_batches(aborted))
        self.run_to_completion(spec)
        assert_exactly_once(self.visible_ids(workdir), expected)

    overlap_kill_points: tuple[str, ...] = OVERLAP_POINTS
    """Where ``test_driver_killed_while_a_batch_commits_in_the_background`` kills the
    driver, one point per batch."""

    @pytest.mark.chaos
    def test_driver_killed_while_a_batch_commits_in_the_background(self, workdir: str
                                                                   ) -> None:
        """``overlap_commits``: the driver is killed at each point of a batch's phase 2,
        which runs on a thread beside the next batch's phase 1 (Spark may already count
        the batch as done, and plan the next one). After each kill every earlier batch
        is visible exactly once and no id twice; the restart finishes the batch first.
        The last restart runs to the end: every id exactly once.

        A batch after a kill may hold more than one input file: Spark's stream thread
        goes on planning while the commit thread dies, and the restart reads on from
        there. So the earlier batches are known by their files, not the later ones."""
        points = self.overlap_kill_points
        # After a kill the next batch may take two files: enough for every point.
        expected = self.prepare_input(workdir, files=CRASH_BATCH + 2 * len(points) + 2)
        spec = overlapping(self.job(workdir))
        for batch_id, point in enumerate(points, start=CRASH_BATCH):
            crashed = self.run(spec, fault=f"{point}@{batch_id}")
            assert crashed.crashed, f"fault {point}@{batch_id} did not fire:\n{crashed.tail()}"
            visible = self.visible_ids(workdir)
            assert len(visible) == len(set(visible)), f"an id visible twice after {point}"
            earlier = self.ids_of_batches(batch_id)  # in batches before this one
            known = set(earlier)
            assert_exactly_once([i for i in visible if i in known], earlier)
        self.run_to_completion(spec)
        assert_exactly_once(self.visible_ids(workdir), expected)

    @pytest.mark.chaos
    def test_overlapped_batch_finished_by_a_restart_without_new_input(self, workdir: str
                                                                       ) -> None:
        """``overlap_commits``: the last batch is decided, Spark counts it done (its
        commit log holds it), and the driver dies before any of it is committed
        (``kill_once_spark_counted``). The restart has no new input, so Spark runs no
        batch: the adapter's start hook (``core.streaming.onstart``) commits it, and every id
        is visible once when the restarted query ends."""
        expected = self.prepare_input(workdir, files=2)
        spec = overlapping(self.job(workdir))
        last = 1  # one file per batch: batches 0 and 1
        crashed = self.run(spec, fault=f"{COUNTED_POINT}@{last}")
        assert crashed.crashed, f"{COUNTED_POINT} did not fire:\n{crashed.tail()}"
        assert_exactly_once(self.visible_ids(workdir), self.ids_of_batches(last))
        restarted = self.run(spec)
        assert restarted.returncode == 0, restarted.tail()
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
    def test_at_least_once_task_killed_then_replayed_with_fewer_partitions(
            self, workdir: str) -> None:
        """``at_least_once`` never loses a row and never gets stuck: partition 0's task
        commits, then partition 1's first attempt dies (its worker exits at once, as
        under kill -9) after writing some rows; with no task retries the query fails.
        The restart replays the batch on one partition (a restart on fewer cores, another
        ``repartition``): that partition holds other rows than partition 0 held, so it
        must be written, not skipped on partition 0's marker (the replay rule, see
        ``conformance.replays``); the dead attempt's claim must not block it."""
        if not self.at_least_once_supported(workdir):
            pytest.skip("the connector does not offer at_least_once")
        expected = self.prepare_input(workdir)
        spec = self.job(workdir, mode="at_least_once")
        barrier = os.path.join(workdir, "faults")
        failed = self.run(spec, fault=f"kill_task_mid_write_after_first_commit@{CRASH_BATCH}",
                          barrier=barrier)
        assert failed.returncode != 0, failed.tail()
        assert "Python worker exited unexpectedly" in failed.stderr or "crashed" in (
            failed.stderr), f"the task was not killed:\n{failed.tail()}"
        # Partition 0's task signals once it committed. (Its rows need not be visible
        # yet: on Kafka the dead attempt's open transaction hides what was committed
        # after its first record from read_committed readers, until the restart closes
        # it.)
        assert os.path.exists(os.path.join(barrier, AFTER_FIRST_COMMIT_SIGNAL)), (
            "partition 0 of the killed batch committed nothing before partition 1 died")
        self.run_to_completion(dataclasses.replace(spec, partitions=1), restarts=1)
        visible = self.visible_ids(workdir)
        missing = sorted(set(expected) - set(visible))
        assert not missing and set(visible) == set(expected), (
            f"missing={missing[:20]}: {REPLAY_RULE}")

    def test_at_least_once_queries_with_the_session_checkpoint_lose_nothing(
            self, workdir: str) -> None:
        """The checkpoint set as most jobs set it, in the session
        (``spark.sql.streaming.checkpointLocation``): a format never sees it, nor does
        foreachBatch under Spark Connect. Two at-least-once queries with the same sink
        name run one after the other (Spark checkpoints each in a fresh directory under
        the root): the first writes three batches, the second one. Every row of both
        arrives: the second query's batch 0 is not taken for a replay of the first's,
        whose markers stand at batch 2 (``core.streaming.identity``)."""
        if not self.at_least_once_supported(workdir):
            pytest.skip("the connector does not offer at_least_once")
        if self.route != "format" and not self.connect:
            pytest.skip("classic foreachBatch reads the running query's ID itself")
        spec = dataclasses.replace(self.job(workdir, mode="at_least_once"),
                                   session_checkpoint=True)
        expected: list[int] = []
        for query, files in (("first", 3), ("second", 1)):
            ids = [[i + 500 * (query == "second") for i in part]
                   for part in self.input_ids(files)]
            source = os.path.join(workdir, f"input-{query}")
            expected += write_input(source, ids)
            result = self.run(dataclasses.replace(spec, input=source))
            assert result.returncode == 0, result.tail()
            missing = sorted(set(expected) - set(self.visible_ids(workdir)))
            assert not missing, (f"the {query} query lost {len(missing)} rows "
                                 f"({missing[:10]}...): two queries were taken for one")

    lease_ttl_s = 1.0
    """The lease lifetime of ``test_recover_refuses_beside_a_long_batch``'s query."""

    def test_recover_refuses_beside_a_long_batch(self, workdir: str) -> None:
        """A batch runs longer than the query's lease lifetime (a task of phase 1 is held
        until the test releases it) while an operator runs ``sparkeos recover`` without
        ``--force``: recover must refuse (the lease is kept fresh by whatever runs the
        batch), never abort the batch; released, the batch commits every row once.
        Through a format, the lease is released once the last batch committed, so
        recover may act at once after the query stopped."""
        expected = self.prepare_input(workdir, files=2)
        spec = self.job(workdir)
        spec.settings["lease_ttl_s"] = self.lease_ttl_s
        barrier = os.path.join(workdir, "faults")
        outcome: dict[str, JobResult] = {}
        job = threading.Thread(target=lambda: outcome.update(result=run_job_process(
            spec, fault=f"hold_in_phase_1@{CRASH_BATCH}", barrier=barrier)))
        job.start()
        try:
            _wait_for(lambda: os.path.exists(os.path.join(barrier, "held")),
                      "a task of the batch held in phase 1")
            log = CommitLog(open_store(sink_log_location(spec.checkpoint, spec.name)))
            # A lease written when the batch began, and never renewed, is stale by now.
            stale_after = time.time() + 1.5 * self.lease_ttl_s
            _wait_for(lambda: time.time() > stale_after, "one and a half lease lifetimes")
            refused = self.recover_cli(workdir, spec.checkpoint, force=False)
            holder = int((log.read_lease() or {}).get("pid", 0))
            if self.route == "format" and os.path.exists(f"/proc/{holder}/comm"):
                with open(f"/proc/{holder}/comm") as fh:  # the driver, not a worker
                    assert fh.read().strip() == "java", f"the lease names pid {holder}"
        finally:
            os.makedirs(barrier, exist_ok=True)
            open(os.path.join(barrier, "release"), "w").close()
            job.join(600)
        assert refused.returncode != 0 and "holds the lease" in refused.stderr, (
            f"recover acted beside a live batch:\n{refused.stdout}{refused.stderr}")
        assert outcome["result"].returncode == 0, outcome["result"].tail()
        assert_exactly_once(self.visible_ids(workdir), expected)
        if self.route == "format":
            assert (log.read_lease() or {}).get("released"), log.read_lease()

    def recover_cli(self, workdir: str, checkpoint: str, force: bool
                    ) -> subprocess.CompletedProcess[str]:
        """``sparkeos recover`` of ``checkpoint`` in a process of its own."""
        sets = [arg for key, value in self.recover_settings(workdir).items()
                for arg in ("--set", f"{key}={value}")]
        return subprocess.run([sys.executable, "-m", "sparkeos.cli", "recover",
                               *(["--force"] if force else []), checkpoint, *sets],
                              capture_output=True, text=True, timeout=300)

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

    # -- speculation on a real cluster -------------------------------------------------------------
    @pytest.mark.speculation
    @pytest.mark.parametrize("winner", ["copy", "original"])
    def test_speculative_attempts_on_a_cluster(self, workdir: str, spark_cluster: str,
                                               winner: str) -> None:
        """Spark runs two attempts of partition 0's task of batch 1 at once, on two
        hosts; the original is held back until the copy started (or prepared), without
        timing. Whichever wins, every id lands once, and a recovery after the job
        leaves nothing prepared or staged."""
        expected = self.prepare_input(workdir)
        barrier = os.path.join(workdir, "barrier")
        spec = self.job(workdir, master=spark_cluster, spark_conf=SPECULATION_CONF)
        result = self.run(spec, fault=f"speculate_{winner}_wins@{CRASH_BATCH}",
                          env={BARRIER_ENV: barrier})
        assert result.returncode == 0, result.tail()
        assert os.path.exists(os.path.join(barrier, "copy-started")), (
            "Spark never launched a speculative copy of the held-back attempt:\n"
            + result.tail())
        log = CommitLog(open_store(sink_log_location(spec.checkpoint, spec.name)))
        decided = log.batches()[CRASH_BATCH].decided
        assert decided is not None
        tag = int(decided["participants"][0]["tag"])
        assert (tag > 0) == (winner == "copy"), f"batch {CRASH_BATCH} decided attempt {tag}"
        assert_exactly_once(self.visible_ids(workdir), expected)
        _wait_until_gone(barrier, ("original-started", "copy-started"))  # then recover
        meta = log.read_meta() or {}
        Coordinator(self.sink_factory(workdir), CoordinatorConfig(name=spec.name), log,
                    str(meta["query_key"])).recover(full=True)
        assert_exactly_once(self.visible_ids(workdir), expected)
        self.assert_no_leftovers(workdir)

    # -- protocol-level cases in process (no Spark) ---------------------------------------------
    IN_PROCESS_SINK = "inproc"

    def in_process_key(self, workdir: str) -> str:
        """A query key of this test's own, so no two tests share transaction IDs."""
        return "ip" + hashlib.sha256(workdir.encode()).hexdigest()[:10]

    def in_process_store(self, workdir: str) -> Store:
        """Where the in-process cases keep their commit log (a variant with its state on
        other storage puts it there)."""
        return LocalStore(os.path.join(workdir, "inprocess-log"))

    def in_process_coordinator(self, workdir: str, faults: FaultPlan | None = None,
                               sink: TransactionalSink[Any] | None = None,
                               ) -> tuple[TransactionalSink[Any], Coordinator]:
        sink = sink if sink is not None else self.sink_factory(workdir)
        log = CommitLog(self.in_process_store(workdir))
        return sink, Coordinator(sink, CoordinatorConfig(name=self.IN_PROCESS_SINK), log,
                                 self.in_process_key(workdir), faults)

    def attempt(self, coord: Coordinator, batch_id: int, partition: int, tag: int,
                run: int = 0) -> Transaction:
        """The transaction of one task attempt, as the coordinator would hand it out."""
        return coord.pool.transaction(batch_id, partition, run, tag)

    def finish(self, workdir: str, sink: TransactionalSink[Any], expected: list[int]) -> None:
        """A restarted driver's full recovery, then the checks every case ends with."""
        _, coord = self.in_process_coordinator(workdir, sink=sink)
        coord.recover(full=True)
        assert_exactly_once(self.visible_ids(workdir), expected)
        self.assert_no_leftovers(workdir)

    def test_zombie_attempt_never_becomes_visible(self, workdir: str) -> None:
        """Invariant 5: an attempt still running while another attempt of the same task
        is decided and committed; it goes on writing and preparing afterwards."""
        sink, coord = self.in_process_coordinator(workdir)
        sink.validate(ID_SCHEMA)
        zombie_txn = self.attempt(coord, 0, 0, tag=5)
        zombie = sink.begin(zombie_txn)
        sink.write(zombie, id_batch([999_999]))
        coord.run_batch(0, ListRunner([[1, 2], [3]]))
        _attempt_quietly(lambda: (sink.write(zombie, id_batch([999_998])),
                                  sink.prepare(zombie)))
        coord.run_batch(1, ListRunner([[4], [5]]))
        coord.run_batch(2, ListRunner([[6], [7]]))  # reuses the zombie's slot
        self.finish(workdir, sink, [1, 2, 3, 4, 5, 6, 7])

    def test_concurrent_attempt_starts_after_the_first_prepared(self, workdir: str) -> None:
        """Speculation, the original wins: a copy of partition 0's task starts once the
        original prepared and prepares too (or is refused). The copy must not undo the
        original, which the batch decides."""
        sink, coord = self.in_process_coordinator(workdir)
        copies: list[threading.Thread] = []

        def start_copy(partition: int, attempt: int) -> None:
            if partition == 0 and attempt == 0:
                def copy() -> None:
                    handle = sink.begin(self.attempt(coord, 0, 0, tag=1))
                    sink.write(handle, id_batch([1, 2]))
                    sink.prepare(handle)
                copies.append(_in_thread(copy))

        coord.run_batch(0, ArrowRunner([id_batch([1, 2]), id_batch([3])],
                                       after_attempt=start_copy))
        for thread in copies:
            thread.join(120)
        decided = coord.states()[0].decided
        assert decided is not None and decided["participants"][0]["tag"] == 0
        coord.run_batch(1, ListRunner([[4], [5]]))
        self.finish(workdir, sink, [1, 2, 3, 4, 5])

    def test_concurrent_copy_wins_and_the_original_goes_on(self, workdir: str) -> None:
        """Speculation, the copy wins: the original began first and is slow; the batch
        decides the copy; then the original prepares as a zombie."""
        sink, coord = self.in_process_coordinator(workdir)
        sink.validate(ID_SCHEMA)
        original = sink.begin(self.attempt(coord, 0, 0, tag=0))
        sink.write(original, id_batch([1, 2]))
        coord.run_batch(0, ArrowRunner([id_batch([1, 2]), id_batch([3])],
                                       first_attempt={0: 1}))
        decided = coord.states()[0].decided
        assert decided is not None and decided["participants"][0]["tag"] == 1
        _attempt_quietly(lambda: sink.prepare(original))
        coord.run_batch(1, ListRunner([[4], [5]]))
        self.finish(workdir, sink, [1, 2, 3, 4, 5])

    def test_late_attempt_after_the_batch_was_aborted(self, workdir: str) -> None:
        """A task attempt still running when phase 1 failed prepares after the abort;
        the batch is re-run with fewer partitions. Its transaction must not stay behind
        (bug 2 of the concurrency issue)."""
        sink, coord = self.in_process_coordinator(workdir)
        coord.run_batch(0, ListRunner([[1], [2]]))
        late = sink.begin(self.attempt(coord, 1, 0, tag=3))
        sink.write(late, id_batch([3, 4]))

        def fail_partition_1(partition: int, attempt: int) -> None:
            if partition == 1:
                raise InjectedTaskFailure("partition 1 keeps failing")

        with pytest.raises(TransactionAbortedError):
            coord.run_batch(1, ArrowRunner([id_batch([3, 4]), id_batch([5])],
                                           before_attempt=fail_partition_1))
        _attempt_quietly(lambda: sink.prepare(late))
        _, rerun = self.in_process_coordinator(workdir, sink=sink)
        rerun.run_batch(1, ListRunner([[3, 4, 5]]))
        self.finish(workdir, sink, [1, 2, 3, 4, 5])

    def test_begin_claims_its_transaction_id_exclusively(self, workdir: str) -> None:
        """A retried stage numbers its attempts from 0 again, so a zombie may hold the
        same ID: the second attempt must fail, never write into the first one's state."""
        sink, coord = self.in_process_coordinator(workdir)
        sink.validate(ID_SCHEMA)
        txn = self.attempt(coord, 0, 0, tag=0)
        first = sink.begin(txn)
        sink.write(first, id_batch([1]))
        receipt = sink.prepare(first)
        with pytest.raises(Exception):  # noqa: B017 - any error: it must not go on
            second = sink.begin(txn)
            sink.write(second, id_batch([2]))
            sink.prepare(second)
        sink.commit(txn, receipt)
        assert_exactly_once(self.visible_ids(workdir), [1])

    def test_lost_checkpoint_is_refused_not_duplicated(self, workdir: str) -> None:
        """A query whose checkpoint was lost (a new commit log, a new query key) finds
        what the old query committed under the same sink name and refuses, instead of
        writing it all again."""
        sink, old = self.in_process_coordinator(workdir)
        if type(sink).output_of_other_queries is TransactionalSink.output_of_other_queries:
            pytest.skip("the connector cannot tell (output_of_other_queries not given)")
        old.run_batch(0, ListRunner([[1, 2], [3]]))
        fresh = CommitLog(LocalStore(os.path.join(workdir, "new-checkpoint-log")))
        lost = Coordinator(sink, CoordinatorConfig(name=self.IN_PROCESS_SINK), fresh,
                           self.in_process_key(workdir + "/new"))
        with pytest.raises(ConfigurationError, match="another query") as info:
            lost.run_batch(0, ListRunner([[1, 2], [3]]))
        assert "restore the checkpoint" in str(info.value)
        assert not fresh.batches() and sorted(self.visible_ids(workdir)) == [1, 2, 3]
        accepting = Coordinator(sink, CoordinatorConfig(name=self.IN_PROCESS_SINK,
                                                        existing_output="accept"),
                                fresh, self.in_process_key(workdir + "/new"))
        accepting.run_batch(0, ListRunner([[4]]))  # the user chose to start anew
        assert sorted(self.visible_ids(workdir)) == [1, 2, 3, 4]

    def test_commit_of_vanished_prepared_state_is_data_loss(self, workdir: str) -> None:
        """The rule "commit raises DataLossError when the prepared state is gone and
        nothing is visible": silence here would be silent loss."""
        sink, coord = self.in_process_coordinator(workdir)
        sink.validate(ID_SCHEMA)
        txn = self.attempt(coord, 0, 0, tag=0)
        handle = sink.begin(txn)
        sink.write(handle, id_batch([1, 2]))
        receipt = sink.prepare(handle)
        sink.rollback(txn)  # someone removed the prepared state behind the query's back
        with pytest.raises(DataLossError):
            sink.commit(txn, receipt)
        assert self.visible_ids(workdir) == []

    @pytest.mark.parametrize("point", ALL_POINTS)
    def test_in_process_crash_matrix(self, workdir: str, point: str) -> None:
        """Every crash point, simulated in process against the real destination, through
        the class's route (a format's three calls too: ``replay_route``)."""
        sink = self.sink_factory(workdir)
        plan = [[[1, 2], [3]], [[4], [5, 6]], [[7], [8]]]
        spark_committed: list[int] = []
        for faults in (FaultPlan(point, 1, simulate=True), None):
            route = self.replay_route(workdir, Guarantee.EXACTLY_ONCE, sink, faults)
            with contextlib.suppress(InjectedCrash):  # the process died; restart it
                run_uncommitted(route, plan, spark_committed)
        self.recover_route(workdir, sink)
        assert_exactly_once(self.visible_ids(workdir), list(range(1, 9)))
        self.assert_no_leftovers(workdir)

    # -- a long run, compressed --------------------------------------------------------------
    soak_batches_default = 1000
    """Batches of the soak case (``SPARKEOS_SOAK_BATCHES`` overrides)."""

    def soak_settings(self) -> dict[str, Any]:
        """Sink settings for the soak: the smallest retentions, so every horizon is
        crossed many times."""
        return {}

    def bookkeeping(self, workdir: str) -> dict[str, int]:
        """Counts of the connector's own bookkeeping that must stay bounded (marker
        rows, records of published batches...), sampled during the soak."""
        return {}

    def bookkeeping_bounds(self) -> dict[str, int]:
        """Upper bounds of ``bookkeeping``'s counts."""
        return {}

    @pytest.mark.soak
    def test_soak_many_tiny_batches_stay_bounded(self, workdir: str) -> None:
        """Hundreds to thousands of tiny batches with driver kills and task retries sprinkled in:
        every id exactly once, and the commit log, the connector's bookkeeping, what is
        staged or prepared and the driver's memory stay bounded."""
        from ..soak import RETAIN_BATCHES, run_soak, soak_batches

        batches = soak_batches(self.soak_batches_default)
        spec = self.sink_spec(workdir)
        kwargs = {**spec.get("kwargs", {}), **self.soak_settings()}

        def make_sink() -> TransactionalSink[Any]:
            return load_factory(spec["factory"])(**kwargs)  # type: ignore[no-any-return]

        figures = run_soak(workdir, make_sink, self.in_process_key(workdir), batches,
                           lambda: self.bookkeeping(workdir), lambda: self.leftovers(workdir))
        report = os.environ.get("SPARKEOS_SOAK_REPORT")
        if report:
            with open(report, "a") as fh:
                fh.write(f"{type(self).__name__}: {figures.describe()}\n")
        expected = [b * 10 + i for b in range(batches) for i in (1, 2, 3, 4)]
        assert_exactly_once(self.visible_ids(workdir), expected)
        assert figures.kills > 0 and figures.retries > 0, figures.describe()
        bounds = {"commit_log_files": 4 * RETAIN_BATCHES + 10,
                  "coordinator_states": RETAIN_BATCHES + 5, "leftovers": 4,
                  "rss_growth_mb": 64, **self.bookkeeping_bounds()}
        over = {k: figures.peak(k) for k, bound in bounds.items() if figures.peak(k) > bound}
        assert not over, f"not bounded: {over} (bounds {bounds}); {figures.describe()}"
        self.assert_no_leftovers(workdir)

    def test_commit_is_idempotent(self, workdir: str) -> None:
        sink, coord = self.in_process_coordinator(workdir)
        coord.run_batch(0, ListRunner([[1], [2]]))
        state = coord.states()[0]
        assert state.decided is not None
        for participant in state.decided["participants"]:
            partition = int(participant["partition"])
            txn = self.attempt(coord, 0, partition, int(participant["tag"]))
            sink.commit(txn, participant["receipt"])
            sink.rollback(self.attempt(coord, 5, partition, tag=0))  # never used: fine
        assert_exactly_once(self.visible_ids(workdir), [1, 2])
        self.assert_no_leftovers(workdir)


def _wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 240.0) -> None:
    """Poll until ``condition`` holds (an event, not a fixed sleep: the deadline only
    bounds a failure)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def _wait_until_gone(barrier: str, signals: tuple[str, ...]) -> None:
    """Wait until every task process that left one of ``signals`` (each line a PID, on
    this machine's cluster) has exited. The application is gone; its zombies go with
    its executors a moment later. A full recovery beside a zombie could miss a file the
    zombie links after the sweep read its manifest (a leftover, never output)."""
    pids: set[int] = set()
    for name in signals:
        with contextlib.suppress(FileNotFoundError), open(os.path.join(barrier, name)) as fh:
            pids |= {int(line) for line in fh if line.strip()}

    def gone() -> bool:
        for pid in pids:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            return False
        return True

    _wait_for(gone, f"the task processes {sorted(pids)} of the finished application to exit")


def _in_thread(fn: Callable[[], None]) -> threading.Thread:
    """Run another task attempt beside this one (its failure is its own)."""
    thread = threading.Thread(target=_attempt_quietly, args=(fn,), daemon=True)
    thread.start()
    return thread


def _attempt_quietly(fn: Callable[[], Any]) -> None:
    """A losing attempt may be refused by the destination; that is its right."""
    with contextlib.suppress(Exception):
        fn()


__all__ = ["ConnectorConformance"]
