"""Variants of ``ConnectorConformance``: classes put first in the bases of a
connector's conformance class to run a part of the suite, or the suite somewhere else
(a standalone cluster, Spark Connect, the sink's Spark format).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

from sparkeos.core.faults import BARRIER_ENV
from sparkeos.core.protocol import CommitLocation
from sparkeos.core.streaming.formatbatch import planned_batch

from .cases import ConnectorConformance
from .support import CRASH_BATCH, assert_exactly_once

CONNECT_CASES = frozenset({"test_end_to_end_several_batches", "test_driver_crash_then_restart"})
SAMPLED_DRIVER_POINTS = ("kill_driver_after_first_prepare", "after_first_commit")
"""A kill before the decision (from a task in phase 1) and one among the commits: the
restart rolls the first back, and commits the second's decided participants (one of
them again, which must do nothing). Variants of a suite that change where the job runs
or stores its state (Spark Connect, HDFS) run these; the protocol code is the same, the
in-process crash matrix runs every point (``after_decided`` too) against each
connector's destination, and the file sink's plain suite every point in real
processes."""
MERGED_DRIVER_POINTS = ("kill_driver_after_first_prepare", "after_decided",
                        "after_first_commit")
"""``SAMPLED_DRIVER_POINTS`` for a sink that commits a batch in one unit (one commit
group, ``commit_merged``: a table commit): its ``after_first_commit`` comes after the
whole commit, so the kill between the decision and the commit is ``after_decided``;
``after_first_commit`` (in the background, ``SampledDriverKills``) is the kill after
the table commit, before the batch's ``finished`` record."""


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


def speculation_won_by(*winners: str) -> Any:
    """``test_speculative_attempts_on_a_cluster`` with only these winners (``copy``: the
    speculative copy wins, ``original``: the original attempt does), for a class body."""

    @pytest.mark.speculation
    @pytest.mark.parametrize("winner", list(winners))
    def case(self: Any, workdir: str, spark_cluster: str, winner: str) -> None:
        ConnectorConformance.test_speculative_attempts_on_a_cluster(
            self, workdir, spark_cluster, winner)

    return case


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
    among the commits after it) instead of all eight, the second in a batch's commit
    running in the background beside the next batch (``overlap_commits``: what
    ``test_driver_killed_while_a_batch_commits_in_the_background`` does, which the
    class leaves out). The
    in-process crash matrix still runs every point against the connector's real
    destination; the points left out (``after_begun``, ``after_all_prepared``,
    ``after_decided``, ``after_all_commits``, ``after_finished``) exercise the
    protocol's code, not the connector's (after ``after_first_commit`` the restart
    commits decided participants, as after ``after_decided``; a sink that commits a
    batch in one unit sets ``MERGED_DRIVER_POINTS``), and the file sink's suite runs
    them in real processes.

    Task retries and speculation through Spark are the route's: the file sink's suites
    run them (retries before and after prepare through ``foreachBatch``, after prepare
    through the format; speculation with the original winning through ``foreachBatch``
    and the copy through the format; every combination with
    ``SPARKEOS_FILE_SUITE=every``), and
    ``SampledSparkAttempts`` keeps one of each for a sink that wants them (Kafka). What
    the connector does with another attempt runs in process against its destination: a
    retry that meets the dead attempt's prepared state (``task_fail_after_prepare`` in
    the crash matrix), a zombie that prepares after the decision, a copy that wins while
    the original goes on. What Spark adds (its attempt numbers, two attempts really
    running, its choice of the winner) is the same code for every sink.

    The plain writer's control runs without a kill (``plain_replay_control``): Spark
    replays a plain query's last batch, as after a driver killed between the write and
    Spark's record of the batch, and the reader must count its rows twice. The kill of
    a plain writer runs in the demo's test (``integration/test_demo.py``) and, with
    ``SPARKEOS_FILE_SUITE=every``, in the file sink's suite.

    The kills end without the extra run whose task fails with no retries left: that
    abort is Spark's and the protocol's, proven through Spark by the file sink's suites;
    the connector's rollback of a failed task's prepared work runs in its in-process
    matrix (``task_fail_after_prepare``)."""

    driver_kill_points = SAMPLED_DRIVER_POINTS
    background_kill_points = frozenset({"after_first_commit"})
    abort_after_kills = False

    # The kill among the commits runs with overlapping commits, in the background
    # commit: the driver-kill sequence's last point (``background_kill_points``).
    test_driver_killed_while_a_batch_commits_in_the_background = None
    # at_least_once's replay rule runs in process against the destination (a batch half
    # written, replayed on fewer, more and the same partitions: ``ReplayCases``); the
    # worker killed through Spark is the route's, run by the file format's suite and by
    # Kafka's direct mode (whose killed producer leaves a transaction open).
    test_at_least_once_task_killed_then_replayed_with_fewer_partitions = None

    test_task_retry_reuses_the_transaction_id = None
    test_recover_refuses_beside_a_long_batch = None  # the route's lease: the file sink's
    # The start hook's commit is recovery's (the in-process matrix runs it against the
    # destination, the recovery cases through Spark); the file sink's suite runs it.
    test_overlapped_batch_finished_by_a_restart_without_new_input = None
    test_speculative_attempts_on_a_cluster = None

    def test_plain_foreachbatch_duplicates_under_the_same_crash(self, workdir: str) -> None:
        plain_replay_control(self, workdir)


class SampledSparkAttempts:
    """Put first in the bases of a ``SampledDriverKills`` class to run one task retry and
    one speculation through Spark: partition 0's first attempt dies after it prepared
    and Spark's retry (a new attempt number, the same transaction ID) meets its prepared
    state; and on the cluster the copy wins while the original, held back in phase 1,
    begins and prepares as a zombie after the decision, beside the phase-2 commits. The
    Kafka suite keeps them because there each attempt opens a transactional producer
    and the fencing between them is the broker's."""

    test_task_retry_reuses_the_transaction_id = _task_retry_after_prepare_only

    test_speculative_attempts_on_a_cluster = speculation_won_by("copy")


def plain_replay_control(suite: Any, workdir: str) -> None:
    """The control of a plain ``foreachBatch`` writer without a kill: its query runs to
    the end, Spark's record of the last batch is removed from the checkpoint (what a
    driver killed after the write and before that record leaves), and the restart
    replays the batch. The reader must see its rows twice: a reader that cannot count
    a duplicate proves nothing of the exactly-once runs."""
    plain = suite.plain_spec(workdir)
    if plain is None:
        pytest.skip("connector gives no plain writer to compare with")
    expected = suite.prepare_input(workdir)
    spec = suite.job(workdir, mode="plain", sink=plain)
    suite.run_to_completion(spec)
    assert_exactly_once(suite.visible_ids(workdir), expected)
    last = len(suite.input_ids()) - 1  # one batch per input file
    commits = os.path.join(spec.checkpoint, "commits")
    assert planned_batch(spec.checkpoint) == last and os.path.exists(
        os.path.join(commits, str(last))), "the plain query's last batch is not its last file"
    for name in (str(last), f".{last}.crc"):
        if os.path.exists(os.path.join(commits, name)):
            os.remove(os.path.join(commits, name))
    suite.run_to_completion(spec)
    visible = suite.visible_ids(workdir)
    assert set(visible) == set(expected)
    twice = sorted((Counter(visible) - Counter(expected)).elements())
    assert twice == sorted(suite.input_ids()[last]), (
        f"plain foreachBatch: the replayed batch {last} should be visible twice, "
        f"these ids are: {twice[:20]}")


class InProcessConformance:
    """Put first in the bases of a variant of a connector's conformance class whose
    difference the Spark jobs do not exercise (another mode of the same commit, the same
    connector on another database): the in-process cases only (the crash matrix,
    concurrent attempts, the commit races)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in SPARK_CASES:
            setattr(cls, name, None)


COMMIT_CASES = frozenset({
    "test_in_process_crash_matrix", "test_two_commits_of_one_transaction_at_every_pair_of_steps",
    "test_a_commit_racing_recover_force_from_the_cli",
    "test_commit_after_a_twin_finished_is_never_data_loss",
    "test_commit_of_vanished_prepared_state_is_data_loss", "test_commit_is_idempotent"})


class CommitCasesOnly:
    """Put first in the bases of a variant of a connector's conformance class that
    differs from a fuller one only in its phase 2 on other storage (an upsert's commit
    on an object store): the in-process crash matrix and the commit's races only. The
    claims, zombies, replays and the soak are the fuller classes'."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("test_") and name not in COMMIT_CASES:
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
    background_kill_points: frozenset[str] = frozenset()
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
    background_kill_points: frozenset[str] = frozenset()  # overlap is foreachBatch's

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):  # a case the subclass names itself is kept
            if (name.startswith("test_") and name not in FORMAT_CASES
                    and name not in cls.__dict__):
                setattr(cls, name, None)

    test_speculative_attempts_on_a_cluster = speculation_won_by("copy")


FORMAT_SAMPLED_POINTS = SAMPLED_DRIVER_POINTS
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


__all__ = ["AT_LEAST_ONCE_CASES", "CONNECT_CASES", "FORMAT_CASES", "FORMAT_SAMPLED_POINTS",
           "MERGED_DRIVER_POINTS", "REPLAY_CASES", "SAMPLED_DRIVER_POINTS", "SPARK_CASES",
           "AtLeastOnceConformance",
           "ClusterConformance", "ConnectConformance", "FormatConformance",
           "InProcessConformance", "SampledConformance", "SampledDriverKills",
           "SampledFormatConformance", "SampledSparkAttempts", "TaskCommitClusterConformance",
           "plain_replay_control"]
