"""The file sink runs the conformance suite on real Spark."""

from __future__ import annotations

import os
import random
import signal
import urllib.parse
from dataclasses import replace
from typing import Any

import pytest

from integration.fixtures.clouds import PrefixOnCloud, StoreCasesOnly
from integration.fixtures.hdfs import CheckpointOnHdfs
from integration.fixtures.s3 import CheckpointOnS3
from sparkeos.connectors.file import read_output
from sparkeos.connectors.file.sink import STAGING_DIR
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.storage.logstores import open_store
from sparkeos.testing.conformance import (
    CRASH_BATCH,
    FORMAT_SAMPLED_POINTS,
    ClusterConformance,
    ConnectConformance,
    ConnectorConformance,
    FormatConformance,
    InProcessConformance,
    SampledConformance,
    assert_exactly_once,
    speculation_won_by,
)
from sparkeos.testing.job import JobSpec, run_job, run_job_process, write_input
from sparkeos.testing.storefaults import StoreWireFaultCases

EVERY_CASE = os.environ.get("SPARKEOS_FILE_SUITE") == "every"
"""``SPARKEOS_FILE_SUITE=every`` (``./run test-spark-versions``, where these two classes
are the whole proof for another pyspark): the cases ``./run test`` leaves to other
sinks' suites run here too."""
FORMAT_DRIVER_POINTS = ("kill_driver_after_first_prepare", "after_decided",
                        "after_first_commit")
"""The format's real-process kills: from a task in phase 1, between the decision and the
commits, among the commits."""


PARTITIONED_COMMIT_CASES = frozenset({
    "test_in_process_crash_matrix", "test_commit_is_idempotent",
    "test_two_commits_of_one_transaction_at_every_pair_of_steps",
    "test_commit_after_a_twin_finished_is_never_data_loss",
    "test_commit_of_vanished_prepared_state_is_data_loss"})
"""What partitioned output changes on another store: the commit, which publishes one
part file per partition directory (made where the store has directories) and can be
cut between two of them. The attempts, the replays and the races around recovery do
not depend on the layout: the local partitioned class and the flat class on each store
run them."""


class PartitionedCommitCases:
    """Put first in the bases of a partitioned variant on another store: the commit's
    cases only (``kept_cases``), partitioned by ``payload``."""

    kept_cases: frozenset[str] = PARTITIONED_COMMIT_CASES

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("test_") and name not in cls.kept_cases:
                setattr(cls, name, None)

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec: dict[str, Any] = super().sink_spec(workdir)  # type: ignore[misc]
        return {**spec, "kwargs": {**spec["kwargs"], "partition_by": ["payload"]}}


class TestFileSinkParquet(ConnectorConformance):
    format = "parquet"

    def output(self, workdir: str) -> str:
        return os.path.join(workdir, "output")

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.file:FileSink",
                "kwargs": {"path": self.output(workdir), "format": self.format}}

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "sparkeos.testing.job:plain_file_writer",
                "kwargs": {"path": self.output(workdir), "format": self.format}}

    def leftovers(self, workdir: str) -> list[str] | None:
        staging = os.path.join(self.output(workdir), STAGING_DIR)
        names = os.listdir(staging) if os.path.isdir(staging) else []
        return sorted(n for n in names if not n.startswith("."))  # not the shared check

    def visible_ids(self, workdir: str) -> list[int]:
        table = read_output(self.output(workdir), self.format)
        return table.column("id").to_pylist() if table.num_rows else []

    soak_batches_default = 500

    if not EVERY_CASE:
        # Proven in ./run test elsewhere, so not run again here (each a Spark process or
        # a cluster app): the at-least-once replay on fewer partitions by the format
        # (the same sink, the same dead claim) and TestKafkaSinkDirect (foreachBatch);
        # the plain writer's duplicates by the demo's plain run (integration/test_demo.py:
        # this writer, a real kill); a speculative copy winning by TestFileSinkFormat and
        # TestKafkaSinkStaged on the same cluster.
        test_at_least_once_task_killed_then_replayed_with_fewer_partitions = None
        test_plain_foreachbatch_duplicates_under_the_same_crash = None

        test_speculative_attempts_on_a_cluster = speculation_won_by("original")

    def soak_settings(self) -> dict[str, Any]:
        # The soak proves what stays bounded, not durability (no machine crashes in
        # it): without fsync its time does not depend on what else writes to the disk
        # (21 s to 110 s for the same case in CI runs).
        return {"fsync": False}


class TestFileSinkPartitioned(InProcessConformance, TestFileSinkParquet):
    """Output laid out by a column (``partition_by``): a participant stages and commits
    one part file per partition directory, so a commit can be cut between two of them.
    The in-process cases: every crash point, concurrent attempts, the commit races and
    the replays. Through Spark, test_file_types.py compares the layout with Spark's.
    Partitioned by ``payload``, a directory per row: the soak's bookkeeping is the
    plain suite's (the layout adds none), its thousands of directories only time."""

    test_soak_many_tiny_batches_stay_bounded = None

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        return {**spec, "kwargs": {**spec["kwargs"], "partition_by": ["payload"]}}


class TestFileSinkConnect(ConnectConformance, TestFileSinkParquet):
    """The file sink through Spark Connect: end to end, and the driver killed from a
    task in phase 1 (with ``SPARKEOS_FILE_SUITE=every`` also among the commits of phase
    2). The session type changes where the driver runs, not the protocol: the plain
    suite kills at every point. The kills' last restart runs the query to the end
    through Connect: its end to end."""

    # In ./run test the kill from a task in phase 1: one among the commits of phase 2
    # under Connect is TestFileSinkFormatConnect's and TestKafkaSinkStagedConnect's.
    driver_kill_points = FORMAT_SAMPLED_POINTS if EVERY_CASE else FORMAT_SAMPLED_POINTS[:1]
    test_end_to_end_several_batches = None


@pytest.mark.chaos
def test_driver_kills_with_batches_coalesced_to_the_writers(tmp_path: Any) -> None:
    """Batches of 6 partitions on local[2] are written by 2 participants (the default
    writers): a driver killed after the decision, then a restart that commits the
    coalesced participants, still leaves every id exactly once."""
    input_ids = [list(range(b * 100, b * 100 + 60)) for b in range(4)]
    expected = write_input(str(tmp_path / "input"), input_ids)
    out = str(tmp_path / "output")
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "ckpt"),
                   sink={"factory": "sparkeos.connectors.file:FileSink",
                         "kwargs": {"path": out}}, partitions=6)
    assert run_job_process(spec, "after_decided@1").crashed
    assert run_job(spec).returncode == 0
    assert_exactly_once(read_output(out).column("id").to_pylist(), expected)
    states = CommitLog(open_store(sink_log_location(str(tmp_path / "ckpt"), "conformance")))
    for state in states.batches().values():
        if state.decided is not None:
            assert len(state.decided["participants"]) <= 2


def _bucketed_format_job(tmp_path: Any, format_name: str, column: str, batches: int,
                         rows: int) -> tuple[JobSpec, str, list[list[int]], list[int]]:
    """A format-route job over ``batches`` input files of ``rows`` ids, partitioned by
    ``column``: each id's ``id % 3`` as text. Returns (spec, output, ids per batch, every
    id)."""
    input_ids = [list(range(b * 100, b * 100 + rows)) for b in range(batches)]
    expected = write_input(str(tmp_path / "input"), input_ids)
    out = str(tmp_path / "output")
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "ckpt"),
                   route="format", partitions=2, sink={
                       "format": format_name,
                       "select": ["id", "payload", f"CAST(id % 3 AS STRING) AS {column}"],
                       "options": {"path": out, "sparkeos.partitionBy": column}})
    return spec, out, input_ids, expected


@pytest.mark.chaos
def test_partitioned_format_killed_among_its_directories_commits(spark: Any,
                                                                 tmp_path: Any) -> None:
    """``format("sparkeos-parquet")`` with ``sparkeos.partitionBy`` in a real Spark job:
    the driver killed after the first part file of a decided batch was published (the
    batch's other directories not yet), then restarted. Every id lands once, in the
    directory of its bucket, and Spark's reader gives the partition column back. (Every
    other point runs in process: TestFileSinkPartitioned, and on the store.)"""
    spec, out, _ids, expected = _bucketed_format_job(tmp_path, "sparkeos-parquet", "bucket",
                                                     batches=3, rows=30)
    assert run_job_process(spec, "after_first_commit@1").crashed
    state = CommitLog(open_store(sink_log_location(spec.checkpoint, spec.name))).batches()[1]
    assert state.needs_commit, "killed between the decision and the last commit"
    assert run_job(spec).returncode == 0
    assert_exactly_once(read_output(out).column("id").to_pylist(), expected)
    rows = spark.read.parquet(out).select("id", "bucket").collect()
    assert sorted(r.id for r in rows) == sorted(expected)
    assert all(int(r.bucket) == r.id % 3 for r in rows), "each id in its bucket's directory"


@pytest.mark.chaos
def test_a_leading_underscore_partition_is_seen_after_a_lost_checkpoint(tmp_path: Any
                                                                        ) -> None:
    """A ``format("sparkeos-json")`` query partitioned by a column ``_day`` is killed
    among the commits of its second batch, then started again over a new checkpoint
    (the old one lost). Spark skips a ``_`` directory only without an ``=``, and so does
    sparkeos: the lost-checkpoint guard finds the committed files under ``_day=...`` and
    refuses (it once saw none and wrote every row again). Nothing is doubled; the query
    over its own checkpoint then finishes, every id once."""
    spec, out, input_ids, expected = _bucketed_format_job(tmp_path, "sparkeos-json", "_day",
                                                          batches=2, rows=10)
    assert run_job_process(spec, "after_first_commit@1").crashed
    table = read_output(out, "jsonl")
    before = table.column("id").to_pylist() if table.num_rows else []
    assert set(input_ids[0]) <= set(before), "read_output sees the _day=... directories"
    assert len(before) == len(set(before))
    lost = replace(spec, checkpoint=str(tmp_path / "new-checkpoint"))
    refused = run_job(lost)
    assert refused.returncode != 0 and "another query" in refused.stderr, refused.tail()
    assert sorted(read_output(out, "jsonl").column("id").to_pylist()) == sorted(before)
    assert run_job(spec).returncode == 0
    table = read_output(out, "jsonl")
    assert_exactly_once(table.column("id").to_pylist(), expected)
    assert all(int(day) == i % 3 for i, day in zip(table.column("id").to_pylist(),
                                                    table.column("_day").to_pylist(),
                                                    strict=True))


@pytest.mark.hdfs
class TestFileSinkHdfs(ClusterConformance, SampledConformance, CheckpointOnHdfs,
                       TestFileSinkParquet):
    """The file sink with its output, the query's checkpoint and so the commit log on a
    real HDFS: staging and commits through WebHDFS, Spark's checkpoint and the commit
    log through Hadoop's own client. Batches run end to end on HDFS in the cluster cases
    (before the kill, and to the end after it), and through Connect below."""

    test_end_to_end_several_batches = None

    def output(self, workdir: str) -> str:
        return f"{self.hdfs_dir}/output"

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.hdfs_names(f"{self.output(workdir)}/{STAGING_DIR}")


@pytest.mark.hdfs
class TestFileSinkPartitionedHdfs(PartitionedCommitCases, TestFileSinkHdfs):
    """Partitioned output on HDFS, the commit's cases in process: each partition
    directory made and its part file renamed into it through WebHDFS. Its crash points
    are the twin commits' steps here (a commit stopped at each step, another finishing
    it): the crash matrix is the local and the S3 classes' (WebHDFS is slower)."""

    kept_cases = PARTITIONED_COMMIT_CASES - {"test_in_process_crash_matrix"}


@pytest.mark.hdfs
class TestFileSinkHdfsConnect(ConnectConformance, TestFileSinkHdfs):
    """On HDFS through Spark Connect, end to end: the commit log reached from Python
    (WebHDFS). The driver kills run in classic mode on HDFS and through Connect on
    local paths."""

    test_driver_crash_then_restart = None
    test_end_to_end_several_batches = ConnectorConformance.test_end_to_end_several_batches


@pytest.mark.s3
class TestFileSinkS3(StoreWireFaultCases, SampledConformance, CheckpointOnS3,
                     TestFileSinkParquet):
    """The file sink with everything on an S3-compatible object store: output, staging,
    claims and publishing by conditional writes (``core.storage.stores``), the commit log
    too, and Spark's checkpoint through S3A. Every in-process case (the crash matrix,
    concurrent attempts, twin commits) with its commit log and output on the store, and
    driver kills at random moments, whose last run goes to the end (every batch end to
    end in Spark with everything on the store: the end-to-end case adds nothing to it).
    A task retried after it prepared is the in-process matrix's
    ``task_fail_after_prepare`` here: the Spark retry adds nothing the store sees."""

    test_task_retry_reuses_the_transaction_id = None
    test_end_to_end_several_batches = None

    def output(self, workdir: str) -> str:
        return f"{self.s3_dir}/output"

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.s3_names(f"{self.output(workdir)}/{STAGING_DIR}")

    @pytest.mark.chaos
    def test_driver_killed_at_random_moments(self, workdir: str) -> None:
        """kill -9 of the driver at a protocol point drawn at random, then twice at a
        random moment of the run (in Spark's own checkpoint writes through S3A as likely
        as in sparkeos'), then a run to the end: every id exactly once, as pyarrow's own
        S3 client reads the output prefix (not sparkeos). The seed is printed to replay
        a failure."""
        seed = random.randrange(2**32)
        print(f"seed={seed}")
        rng = random.Random(seed)
        expected = self.prepare_input(workdir, files=CRASH_BATCH + 3)
        spec = self.job(workdir)
        point = rng.choice(self.driver_kill_points)
        assert self.run(spec, fault=f"{point}@{CRASH_BATCH}").crashed, point
        for _ in range(2):
            killed = run_job_process(spec, timeout=rng.uniform(3.0, 15.0))
            assert killed.returncode in (0, -signal.SIGKILL), killed.tail()
        self.run_to_completion(spec)
        assert_exactly_once(self.read_with_pyarrow(self.output(workdir)), expected)
        # Spark's checkpoint and sparkeos' commit log are there, not on a local disk
        assert {"commits", "offsets", "sparkeos"} <= set(self.s3_names(spec.checkpoint))
        assert self.s3_names(f"{spec.checkpoint}/sparkeos/{spec.name}")

    def read_with_pyarrow(self, uri: str) -> list[int]:
        import pyarrow.dataset as ds
        from pyarrow import fs

        endpoint = urllib.parse.urlparse(self.s3_endpoint)
        s3 = fs.S3FileSystem(endpoint_override=endpoint.netloc, scheme=endpoint.scheme,
                             region=os.environ.get("AWS_REGION", "us-east-1"))
        # pyarrow skips names starting with "." or "_" (the staging prefix) as Spark does
        table = ds.dataset(uri.removeprefix("s3a://"), filesystem=s3, format="parquet")
        return table.to_table(columns=["id"]).column("id").to_pylist()


@pytest.mark.s3
class TestFileSinkPartitionedS3(PartitionedCommitCases, TestFileSinkS3):
    """Partitioned output on the object store, the commit's cases in process: each
    partition directory's part file published by its own conditional write."""


@pytest.mark.cluster
def test_a_directory_the_executors_do_not_share_is_refused_before_the_first_batch(
        tmp_path: Any, spark_cluster: str) -> None:
    """``/proc/self/cwd/out`` is one path for every process but a different directory
    for each (its own working directory): what a local disk mistaken for a shared
    mount looks like. The executors do not see the driver's probe there, so the query
    stops before its first batch with an error naming the path; nothing is written."""
    write_input(str(tmp_path / "input"), [[1, 2, 3], [4, 5, 6]])
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "checkpoint"),
                   sink={"factory": "sparkeos.connectors.file:FileSink",
                         "kwargs": {"path": "/proc/self/cwd/out"}},
                   name="unshared", master=spark_cluster)
    result = run_job_process(spec, cwd=str(tmp_path))  # the driver's /proc/self/cwd
    assert result.returncode != 0, result.tail()
    assert "/proc/self/cwd/out/.sparkeos-staging is not shared" in result.stderr, result.tail()
    assert "an executor on host" in result.stderr
    assert not list((tmp_path / "out").glob("part-*"))
    assert not list((tmp_path / "out" / ".sparkeos-staging").glob(".shared-check-*"))
    log = CommitLog(open_store(sink_log_location(spec.checkpoint, "unshared")))
    assert log.batches() == {}, "a batch began although the check failed"


OUT_OF_TREE = '''
"""A connector in a directory of its own, as a user writes one (not installed)."""
from dataclasses import dataclass

from sparkeos.connectors.file import FileSink


@dataclass(frozen=True)
class TeamSink(FileSink):
    """The team's own sink: the file sink under another name."""


def make(path):
    return TeamSink(path)
'''


@pytest.mark.cluster
def test_a_connector_outside_the_package_reaches_the_executors(tmp_path: Any,
                                                               spark_cluster: str) -> None:
    """A connector module in its own directory is importable by the job's driver, not by
    the executors the cluster's workers start (ModuleNotFoundError inside phase 1): the
    suite's job ships it to them."""
    connector = tmp_path / "team-connector"
    connector.mkdir()
    (connector / "team_sink.py").write_text(OUT_OF_TREE)
    expected = write_input(str(tmp_path / "input"), [[1, 2, 3], [4, 5, 6]])
    out = str(tmp_path / "out")
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "checkpoint"),
                   sink={"factory": "team_sink:make", "kwargs": {"path": out}},
                   name="team", master=spark_cluster)
    result = run_job_process(spec, env={"PYTHONPATH": str(connector)})
    assert result.returncode == 0, result.tail()
    assert_exactly_once(read_output(out).column("id").to_pylist(), expected)


class TestFileSinkFormat(FormatConformance, TestFileSinkParquet):
    """The file sink through ``writeStream.format("sparkeos-parquet")``: every crash
    point in process through the format's own calls (planning, tasks, commit), the
    driver killed in real processes after the decision (at one point of each kind with
    ``SPARKEOS_FILE_SUITE=every``), the abort, a task retry, at-least-once, a
    speculative copy winning on the cluster."""

    test_in_process_crash_matrix = ConnectorConformance.test_in_process_crash_matrix
    test_at_least_once_task_killed_then_replayed_with_fewer_partitions = \
        ConnectorConformance.test_at_least_once_task_killed_then_replayed_with_fewer_partitions
    # Every point runs in process through the format's own calls; in real processes a
    # kill from a task, one between the decision and the commits, one among the
    # commits, and task retries before and after prepare.
    driver_kill_points = FORMAT_DRIVER_POINTS
    if not EVERY_CASE:
        # In ./run test the kill between the decision and the commits (then the abort):
        # a kill from a task through a format is TestKafkaFormat's and
        # TestPostgresFormat's; among this format's commits,
        # test_partitioned_format_killed_among_its_directories_commits and
        # TestFileSinkFormatConnect's. The retry that meets the dead attempt's prepared
        # state; the one before prepare is TestFileSinkParquet's (foreachBatch) and
        # every task point runs in process through the format.
        driver_kill_points = ("after_decided",)
        test_task_retry_reuses_the_transaction_id = \
            SampledConformance.test_task_retry_reuses_the_transaction_id

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-parquet", "options": {"path": self.output(workdir)}}


@pytest.mark.s3
class TestFileSinkFormatS3(FormatConformance, TestFileSinkS3):
    """The format with everything on the S3-compatible store, end to end: the planner
    finds the batch in Spark's offsets log and the query in its metadata there (S3A
    wrote them). The driver kills through the format run on local paths above, and
    with the store through foreachBatch: the protocol is the same."""

    # End to end below, in two runs with the endpoint carried each way.
    test_end_to_end_several_batches = None
    test_driver_crash_then_restart = None
    test_task_retry_reuses_the_transaction_id = None
    test_at_least_once_task_killed_then_replayed_with_fewer_partitions = None
    test_speculative_attempts_on_a_cluster = None

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-parquet", "options": {"path": self.output(workdir)}}

    @pytest.mark.connect
    def test_the_s3a_endpoint_setting_reaches_the_format_without_a_session(
            self, workdir: str) -> None:
        """Issue 37, item 3: the endpoint only in Spark's own setting, no
        ``AWS_ENDPOINT_URL_S3`` in any process. Spark gives the format's planner and
        committer no session; ``sparkeos.register(spark)`` carries the session's
        ``spark.hadoop.fs.s3a.endpoint`` to them with the formats (the first run), or
        the writer gives it as an option of the same name (its restart, two batches
        more, with a format Spark discovered by itself). The last restart registers
        from a Spark Connect client, the query in the server. Without the setting
        carried the planner looks for the checkpoint on Amazon S3."""
        spec = self.job(workdir)
        assert spec.spark_conf.get("spark.hadoop.fs.s3a.endpoint") == self.s3_endpoint
        no_endpoint_env = {"AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": ""}
        expected = self.prepare_input(workdir, files=2)
        result = self.run(replace(spec, register_formats=True), env=no_endpoint_env)
        assert result.returncode == 0, result.tail()
        assert_exactly_once(self.read_with_pyarrow(self.output(workdir)), expected)

        expected = self.prepare_input(workdir, files=4)  # the first two again, unchanged
        options = {**spec.sink["options"], "spark.hadoop.fs.s3a.endpoint": self.s3_endpoint}
        result = self.run(replace(spec, sink={**spec.sink, "options": options}),
                          env=no_endpoint_env)
        assert result.returncode == 0, result.tail()
        assert_exactly_once(self.read_with_pyarrow(self.output(workdir)), expected)

        expected = self.prepare_input(workdir, files=6)
        result = self.run(replace(spec, register_formats=True, connect=True),
                          env=no_endpoint_env)
        assert result.returncode == 0, result.tail()
        assert_exactly_once(self.read_with_pyarrow(self.output(workdir)), expected)


class TestFileSinkFormatConnect(ConnectConformance, TestFileSinkFormat):
    """The format through Spark Connect (registered from the client; the writer runs
    in the server's Python workers): end to end, and the driver killed among the commits
    of phase 2, where the commit runs in the server (a kill in phase 1 is the foreachBatch
    Connect suite's; every point runs in process above). The kill's restart runs
    the query to the end through Connect: its end to end."""

    driver_kill_points = ("after_first_commit",)
    test_end_to_end_several_batches = None


class FileSinkOnCloud(StoreWireFaultCases, StoreCasesOnly, PrefixOnCloud, TestFileSinkParquet):
    """The file sink with its commit log, staging and output on an emulated Google
    Cloud Storage or Azure Blob Storage (``core.storage.stores.gcs`` / ``azure``, the write-once
    layer S3 has): the store's cases only (``StoreCasesOnly``). Spark's checkpoint does
    not go there (no connector in pyspark): the demo runs a query on each
    (integration/test_demo.py)."""

    def output(self, workdir: str) -> str:
        return f"{self.cloud_dir}/output"

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.cloud_names(f"{self.output(workdir)}/{STAGING_DIR}")


@pytest.mark.clouds
class TestFileSinkGcs(FileSinkOnCloud):
    cloud_name = "gcs"


@pytest.mark.clouds
class TestFileSinkAzure(FileSinkOnCloud):
    cloud_name = "azure"
