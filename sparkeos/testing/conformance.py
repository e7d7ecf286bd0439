"""The connector conformance suite: the restart test every sink must pass.

Subclass ``ConnectorConformance`` in a test module and implement:

* ``sink_spec(workdir)``: ``{"factory": "module:callable", "kwargs": {...}}`` building
  your sink in the job's process (it must be importable there);
* ``visible_ids(workdir)``: every ``id`` a reader of your destination sees now,
  duplicates included;
* optionally ``sink_factory(workdir)`` (an in-process sink for the fast protocol
  tests), ``plain_spec(workdir)`` (a plain foreachBatch writer, to show that the
  same crash duplicates without sparkeos) and ``leftovers(workdir)`` (what the
  destination still holds of this test's attempts that never committed: prepared
  transactions, staged files; checked empty after every recovery).

Each crash-point test writes input for several batches, runs the streaming job in a
child process with a crash injected at one protocol point of one batch, checks the
crash happened and what is visible at that moment, restarts the job from its
checkpoint until the input is consumed, and asserts every id exactly once.
Cases a connector cannot support are marked ``pytest.mark.xfail(strict=True)`` in the
subclass, so an unexpected pass is reported too.
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
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from sparkeos.core.commitlog import (
    CommitLog,
    LocalStore,
    Store,
    open_store,
    sink_log_location,
)
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.coordinator import Coordinator
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
from sparkeos.core.protocol import CommitLocation, Transaction, TransactionalSink

from .inprocess import ID_SCHEMA, ArrowRunner, ListRunner, id_batch, run_uncommitted
from .job import JobResult, JobSpec, load_factory, run_job, run_job_process, write_input
from .races import RaceCases
from .replays import REPLAY_RULE, ReplayCases

BEFORE_DECISION = ("after_begun", "after_all_prepared", "kill_driver_after_first_prepare")
AFTER_ALL_COMMITS = ("after_all_commits", "after_finished")
OVERLAP_POINTS = ("after_first_commit", "after_finished")
"""Points of phase 2, which ``overlap_commits`` runs in the background: among the
commits and after the last record (``after_all_commits`` differs from the latter only
by the ``finished`` record; ``tests/core/test_overlap.py`` crashes at every point)."""
CRASH_BATCH = 1
SPECULATION_CONF = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "100ms",
    "spark.speculation.efficiency.enabled": "false",
    "spark.executor.memory": "1g",
    "spark.task.maxFailures": "4",
}
"""Speculate as soon as one of the two tasks of a stage finished."""


def assert_exactly_once(visible: list[int], expected: list[int]) -> None:
    counts = Counter(visible)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(expected) - set(counts))
    unexpected = sorted(set(counts) - set(expected))
    assert not duplicates and not missing and not unexpected, (
        f"duplicates={duplicates[:20]} (total {len(duplicates)}), "
        f"missing={missing[:20]} (total {len(missing)}), unexpected={unexpected[:20]}"
    )


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
        aborted = CRASH_BATCH + len(points)
        expected = self.prepare_input(workdir, files=aborted + 2)
        spec = self.job(workdir)  # local[2]: no task retries
        for batch_id, point in enumerate(points, start=CRASH_BATCH):
            crashed = self.run(spec, fault=f"{point}@{batch_id}")
            assert crashed.crashed, f"fault {point}@{batch_id} did not fire:\n{crashed.tail()}"
            visible = self.visible_ids(workdir)
            earlier = self.ids_of_batches(batch_id)
            if point in BEFORE_DECISION:  # invariant 1: nothing visible before the decision
                assert_exactly_once(visible, earlier)
            elif point in AFTER_ALL_COMMITS:  # the kill really came after the commits
                assert_exactly_once(visible, self.ids_of_batches(batch_id + 1))
            else:
                known = set(earlier)
                assert_exactly_once([i for i in visible if i in known], earlier)
        if self.abort_after_kills:
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
        spec = self.job(workdir)
        spec.settings["overlap_commits"] = True
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
        batch: the adapter's start hook (``core.onstart``) commits it, and every id is
        visible once when the restarted query ends."""
        expected = self.prepare_input(workdir, files=2)
        spec = self.job(workdir)
        spec.settings["overlap_commits"] = True
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
        ``sparkeos.testing.replays``); the dead attempt's claim must not block it."""
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
        whose markers stand at batch 2 (``core.identity``)."""
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
        # The application is gone, so are its zombies: a full recovery sweeps the rest.
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
    soak_batches_default = 2000
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
        """Thousands of tiny batches with driver kills and task retries sprinkled in:
        every id exactly once, and the commit log, the connector's bookkeeping, what is
        staged or prepared and the driver's memory stay bounded."""
        from .soak import RETAIN_BATCHES, run_soak, soak_batches

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


def _in_thread(fn: Callable[[], None]) -> threading.Thread:
    """Run another task attempt beside this one (its failure is its own)."""
    thread = threading.Thread(target=_attempt_quietly, args=(fn,), daemon=True)
    thread.start()
    return thread


def _attempt_quietly(fn: Callable[[], Any]) -> None:
    """A losing attempt may be refused by the destination; that is its right."""
    with contextlib.suppress(Exception):
        fn()


CONNECT_CASES = frozenset({"test_end_to_end_several_batches", "test_driver_crash_then_restart"})
SAMPLED_DRIVER_POINTS = ("kill_driver_after_first_prepare", "after_decided",
                         "after_first_commit")
"""A kill before the decision (from a task in phase 1), one between the decision and the
commits and one among the commits: each way a job can die. Variants of a suite that
change where the job runs or stores its state (Spark Connect, HDFS) run these; the
protocol code is the same, the in-process crash matrix runs every point against each
connector's destination, and the file sink's plain suite every point in real
processes."""


class ClusterConformance:
    """Put first in the bases of a connector's conformance class to run it on the local
    Spark standalone cluster (fixture ``spark_cluster``: executors on two hosts of
    their own) as well: the driver killed between the decision and the commits, then
    restarted; and an executor lost (SIGKILL of its JVM) in the middle of phase 1
    (``TaskCommitClusterConformance`` adds phase 2). Every id exactly once."""

    @pytest.mark.cluster
    @pytest.mark.chaos
    def test_driver_crash_then_restart_on_a_cluster(self, workdir: str,
                                                    spark_cluster: str) -> None:
        suite: Any = self
        expected = suite.prepare_input(workdir)
        spec = suite.job(workdir, master=spark_cluster)
        crashed = suite.run(spec, fault=f"after_decided@{CRASH_BATCH}")
        assert crashed.crashed, f"fault after_decided did not fire:\n{crashed.tail()}"
        suite.run_to_completion(spec)
        assert_exactly_once(suite.visible_ids(workdir), expected)

    @pytest.mark.cluster
    @pytest.mark.chaos
    def test_executor_lost_in_phase_1_on_a_cluster(self, workdir: str,
                                                   spark_cluster: str) -> None:
        self.executor_lost(workdir, spark_cluster, "kill_executor_before_prepare")

    def executor_lost(self, workdir: str, spark_cluster: str, point: str) -> None:
        suite: Any = self
        expected = suite.prepare_input(workdir)
        spec = suite.job(workdir, master=spark_cluster)
        evidence = os.path.join(workdir, "faults")
        result = suite.run(spec, fault=f"{point}@{CRASH_BATCH}", env={BARRIER_ENV: evidence})
        assert os.path.exists(os.path.join(evidence, f"executor-killed-{point}")), (
            f"{point} killed no executor:\n{result.tail()}")
        if result.returncode != 0:  # Spark gave up on the batch: the query restarts
            suite.run_to_completion(spec)
        assert_exactly_once(suite.visible_ids(workdir), expected)


class TaskCommitClusterConformance(ClusterConformance):
    """``ClusterConformance`` for sinks that commit in tasks (``CommitLocation.TASKS``):
    an executor is also lost right after it committed a participant, before Spark has
    the task's result, so Spark runs that commit again elsewhere."""

    @pytest.mark.cluster
    @pytest.mark.chaos
    def test_executor_lost_in_phase_2_on_a_cluster(self, workdir: str,
                                                   spark_cluster: str) -> None:
        assert self.sink_factory(workdir).commit_location is CommitLocation.TASKS  # type: ignore[attr-defined]
        self.executor_lost(workdir, spark_cluster, "kill_executor_after_commit")


@pytest.mark.chaos
@pytest.mark.parametrize("point", ["task_fail_after_prepare"])
def _task_retry_after_prepare_only(self: Any, workdir: str, point: str) -> None:
    """The task-retry case sampled: a retry that meets the dead attempt's prepared state."""
    ConnectorConformance.test_task_retry_reuses_the_transaction_id(self, workdir, point)


class SampledConformance:
    """Put first in the bases of a variant of a connector's conformance class (the same
    sink with its state on other storage, e.g. HDFS) to run the in-process cases (of the
    replay cases, the at-least-once replay on other partitions) and a sample of the
    Spark jobs: end to end and a task retry after prepare. The driver kills, the
    plain-writer, no-retry, at-least-once and speculation cases run in the plain suite:
    they exercise the protocol, not the storage. Combine with ``ClusterConformance``
    for a driver kill and lost executors with the state on that storage."""

    test_plain_foreachbatch_duplicates_under_the_same_crash = None
    test_driver_crash_then_restart = None
    test_driver_killed_while_a_batch_commits_in_the_background = None
    test_overlapped_batch_finished_by_a_restart_without_new_input = None
    test_speculative_attempts_on_a_cluster = None
    test_at_least_once_task_killed_then_replayed_with_fewer_partitions = None
    test_at_least_once_queries_with_the_session_checkpoint_lose_nothing = None
    test_soak_many_tiny_batches_stay_bounded = None
    test_recover_refuses_beside_a_long_batch = None
    # The replay rule is the connector's: one case of it against the other storage.
    test_exactly_once_replay_partitioned_otherwise = None
    test_at_least_once_replay_partitioned_as_before_loses_nothing = None
    test_at_least_once_replay_shuffled_writes_nothing_again = None
    test_at_least_once_queries_are_told_apart_by_spark_query_id = None
    test_a_switch_to_exactly_once_over_a_half_written_batch = None

    test_task_retry_reuses_the_transaction_id = _task_retry_after_prepare_only


SPARK_CASES = ("test_driver_crash_then_restart", "test_task_retry_reuses_the_transaction_id",
               "test_driver_killed_while_a_batch_commits_in_the_background",
               "test_overlapped_batch_finished_by_a_restart_without_new_input",
               "test_recover_refuses_beside_a_long_batch",
               "test_end_to_end_several_batches",
               "test_at_least_once_task_killed_then_replayed_with_fewer_partitions",
               "test_at_least_once_queries_with_the_session_checkpoint_lose_nothing",
               "test_plain_foreachbatch_duplicates_under_the_same_crash",
               "test_speculative_attempts_on_a_cluster",
               "test_driver_crash_then_restart_on_a_cluster",
               "test_executor_lost_in_phase_1_on_a_cluster",
               "test_executor_lost_in_phase_2_on_a_cluster")
"""The cases that run Spark jobs (the rest run in process against the destination)."""


class SampledDriverKills:
    """Put first in the bases of a connector's conformance class to kill the driver in
    real processes at one point of each kind (before the decision from a task in phase 1,
    between the decision and the commits, among the commits) instead of all eight. The
    in-process crash matrix still runs every point against the connector's real
    destination; the points left out (``after_begun``, ``after_all_prepared``,
    ``after_all_commits``, ``after_finished``) exercise the protocol's code, not the
    connector's, and the file sink's suite runs them in real processes.

    It samples the other Spark cases the same way: a task retried after it prepared
    (the retry meets the dead attempt's prepared state; a retry before prepare is in
    the in-process matrix), and speculation on the cluster with the copy winning (the
    original then prepares as a zombie after the decision; both orders run in process
    against the destination, and the file sink's suite runs both on the cluster).

    The kills end without the extra run whose task fails with no retries left: that
    abort is Spark's and the protocol's, proven through Spark by the file sink's suites;
    the connector's rollback of a failed task's prepared work runs in its in-process
    matrix (``task_fail_after_prepare``)."""

    driver_kill_points = SAMPLED_DRIVER_POINTS
    abort_after_kills = False
    overlap_kill_points = ("after_first_commit",)

    test_task_retry_reuses_the_transaction_id = _task_retry_after_prepare_only
    test_recover_refuses_beside_a_long_batch = None  # the route's lease: the file sink's
    # The start hook's commit is recovery's (the in-process matrix runs it against the
    # destination, the recovery cases through Spark); the file sink's suite runs it.
    test_overlapped_batch_finished_by_a_restart_without_new_input = None

    @pytest.mark.speculation
    @pytest.mark.parametrize("winner", ["copy"])
    def test_speculative_attempts_on_a_cluster(self, workdir: str, spark_cluster: str,
                                               winner: str) -> None:
        super().test_speculative_attempts_on_a_cluster(  # type: ignore[misc]
            workdir, spark_cluster, winner)


class InProcessConformance:
    """Put first in the bases of a variant of a connector's conformance class whose
    difference the Spark jobs do not exercise (another mode of the same commit, the same
    connector on another database): the in-process cases only (the crash matrix,
    concurrent attempts, the commit races)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in SPARK_CASES:
            setattr(cls, name, None)


AT_LEAST_ONCE_CASES = frozenset({
    "test_at_least_once_replay_partitioned_otherwise_loses_nothing",
    "test_at_least_once_replay_partitioned_as_before_loses_nothing",
    "test_at_least_once_replay_shuffled_writes_nothing_again",
    "test_at_least_once_queries_are_told_apart_by_spark_query_id",
    "test_at_least_once_task_killed_then_replayed_with_fewer_partitions"})


class AtLeastOnceConformance:
    """Put first in the bases of a variant of a connector's conformance class that
    offers only ``at_least_once`` (a direct mode, e.g. ``KafkaSink(mode="direct")``):
    the cases of that guarantee only, in process and through Spark: a batch half
    written by the run that died is replayed on fewer and on more partitions, and on
    the same ones; never a row lost."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("test_") and name not in AT_LEAST_ONCE_CASES:
                setattr(cls, name, None)


class ConnectConformance:
    """Put first in the bases of a connector's conformance class to run its end-to-end
    and driver-kill cases through Spark Connect (a local Connect server per job, killed
    with the job), e.g. ``class TestFileConnect(ConnectConformance, TestFileSink)``.
    Every other case of the suite is left out of the subclass: the in-process cases do
    not involve Spark, and the task and speculation cases need a classic cluster."""

    connect = True
    pytestmark = [pytest.mark.connect]
    driver_kill_points = SAMPLED_DRIVER_POINTS
    abort_after_kills = False  # a task's failure is Spark's, the same under Connect

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):  # a case the subclass names itself is kept
            if (name.startswith("test_") and name not in CONNECT_CASES
                    and name not in cls.__dict__):
                setattr(cls, name, None)  # pytest collects no test of that name


REPLAY_CASES = frozenset({"test_exactly_once_replay_partitioned_otherwise",
                          "test_at_least_once_replay_partitioned_otherwise_loses_nothing",
                          "test_at_least_once_replay_partitioned_as_before_loses_nothing",
                          "test_at_least_once_replay_shuffled_writes_nothing_again",
                          "test_at_least_once_queries_are_told_apart_by_spark_query_id",
                          "test_a_switch_to_exactly_once_over_a_half_written_batch"})
"""The replay cases: in process, through the route of the class (``replay_route``)."""
FORMAT_CASES = REPLAY_CASES | frozenset({
                          "test_end_to_end_several_batches", "test_driver_crash_then_restart",
                          "test_recover_refuses_beside_a_long_batch",
                          "test_task_retry_reuses_the_transaction_id",
                          "test_at_least_once_task_killed_then_replayed_with_fewer_partitions",
                          "test_at_least_once_queries_with_the_session_checkpoint_lose_nothing",
                          "test_speculative_attempts_on_a_cluster"})


class FormatConformance:
    """Put first in the bases of a connector's conformance class to run its Spark cases
    through the sink's Spark format (``writeStream.format("sparkeos-...")``; implement
    ``format_spec``, and ``format_rows`` if its ``select`` projects the rows): end to
    end, the driver killed at every point, task retries, at-least-once with a task
    killed, a speculative copy winning on the cluster (the original goes on as a
    zombie), and the replay cases in process through the format's own calls
    (``sparkeos.testing.formatroute``). The other in-process cases are the same code
    whichever route runs the batch, and are left out."""

    route = "format"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):  # a case the subclass names itself is kept
            if (name.startswith("test_") and name not in FORMAT_CASES
                    and name not in cls.__dict__):
                setattr(cls, name, None)

    @pytest.mark.speculation
    @pytest.mark.parametrize("winner", ["copy"])
    def test_speculative_attempts_on_a_cluster(self, workdir: str, spark_cluster: str,
                                               winner: str) -> None:
        ConnectorConformance.test_speculative_attempts_on_a_cluster(
            self, workdir, spark_cluster, winner)  # type: ignore[arg-type]


FORMAT_SAMPLED_POINTS = ("kill_driver_after_first_prepare", "after_first_commit")
"""A kill from a task in phase 1 and one among the commits of phase 2."""


class SampledFormatConformance(FormatConformance):
    """``FormatConformance`` for a sink whose route is proven by another's full run
    (the file sink's): end to end, and the driver killed in phase 1 and in phase 2,
    where what the sink does differs (its prepare, its commit from the process Spark
    commits in). Task retries, at-least-once and speculation through the format are
    the route's own code, the same for every sink."""

    driver_kill_points = FORMAT_SAMPLED_POINTS
    abort_after_kills = False  # the route's abort(): the file format's suite proves it
    test_task_retry_reuses_the_transaction_id = None
    test_recover_refuses_beside_a_long_batch = None
    test_at_least_once_task_killed_then_replayed_with_fewer_partitions = None
    test_speculative_attempts_on_a_cluster = None  # type: ignore[assignment]
