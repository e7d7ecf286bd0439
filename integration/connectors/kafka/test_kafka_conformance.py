"""The staged KafkaSink runs the conformance suite on real Spark and a real broker.

``visible_ids`` is what a ``read_committed`` consumer sees in the output topic: the
value of every record is the input row as JSON (``{"id": ..., "payload": ...}``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pytest

from integration.fixtures.clouds import StagingOnCloud, StoreCasesOnly
from integration.fixtures.hdfs import CheckpointOnHdfs
from integration.fixtures.s3 import StagingOnS3
from sparkeos.connectors.kafka import KafkaSink, read_topic
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.storage.logstores import open_store
from sparkeos.testing.conformance import (
    AtLeastOnceConformance,
    ConnectConformance,
    ConnectorConformance,
    SampledConformance,
    SampledDriverKills,
    SampledFormatConformance,
    SampledSparkAttempts,
    TaskCommitClusterConformance,
    assert_exactly_once,
)
from sparkeos.testing.job import JobSpec, run_job_process, write_input
from sparkeos.testing.storefaults import StoreWireFaultCases
from sparkeos.testing.tcpproxy import KAFKA, LOST_REPLY, RESET, WireFault
from sparkeos.testing.wirefaults import WireFaultConformance

from .conftest import create_topic, unique_name


class TestKafkaSinkStaged(SampledSparkAttempts, SampledDriverKills, ConnectorConformance):
    bootstrap: str
    topic: str
    prefix: str

    @pytest.fixture(autouse=True)
    def _kafka(self, kafka_bootstrap: str, workdir: str) -> None:
        self.bootstrap = kafka_bootstrap
        self.topic = unique_name(workdir)
        self.prefix = unique_name(workdir, "t") + "-"
        create_topic(kafka_bootstrap, self.topic, partitions=2)

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.kafka:KafkaSink",
                "kwargs": {"bootstrap_servers": self.bootstrap, "topic": self.topic,
                           "staging_dir": os.path.join(workdir, "staging"),
                           "transactional_id_prefix": self.prefix}}

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "sparkeos.connectors.kafka.plain:plain_foreachbatch_writer",
                "kwargs": {"bootstrap_servers": self.bootstrap, "topic": self.topic}}

    def leftovers(self, workdir: str) -> list[str] | None:
        staging = os.path.join(workdir, "staging")
        names = os.listdir(staging) if os.path.isdir(staging) else []
        return sorted(n for n in names if not n.startswith("."))  # not the shared check

    def visible_ids(self, workdir: str) -> list[int]:
        return [int(json.loads(m.value())["id"]) for m in read_topic(self.bootstrap, self.topic)]

    soak_batches_default = 150


class TestKafkaWireFaults(WireFaultConformance, TestKafkaSinkStaged):
    """Issue 37: the staged sink's clients through a fault proxy (which rewrites the
    broker's address in Metadata and FindCoordinator responses to its own), one step of
    phase 2 hurt per case: the reply to the committing EndTxn lost after the
    coordinator committed, the connection reset before it, the reply to
    TxnOffsetCommit (the marker) lost. librdkafka retries each on a new connection; a
    publish that fails anyway is started over, and its marker says it is committed."""

    wire_protocol = KAFKA
    wire_steps = ("end_txn_reply_lost", "end_txn_reset", "marker_reply_lost")

    def wire_upstream(self) -> str:
        if "," in self.bootstrap:
            pytest.skip("the fault proxy stands in for one broker; "
                        f"{self.bootstrap} names several")
        return self.bootstrap

    def wire_sink(self, workdir: str, address: str) -> KafkaSink:
        return KafkaSink(**{**self.sink_spec(workdir)["kwargs"], "bootstrap_servers": address})

    def wire_faults(self, step: str) -> list[WireFault]:
        commit = rf"^EndTxn v\d+ commit {self.prefix}"
        return {
            "end_txn_reply_lost": [WireFault(LOST_REPLY, commit)],
            "end_txn_reset": [WireFault(RESET, commit)],
            "marker_reply_lost": [WireFault(LOST_REPLY, r"^TxnOffsetCommit ")],
        }[step]


class TestKafkaFormat(SampledFormatConformance, TestKafkaSinkStaged):
    """The staged Kafka sink through ``writeStream.format("sparkeos-kafka")``, with the
    options and the ``value`` column of Spark's own Kafka sink; phase 2 publishes from
    the process Spark commits the batch in. One committer (``commitParallelism`` 1):
    every batch of two partitions commits both in one Kafka transaction
    (``core.snapshot.committers``), through the kills and the crash matrix."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-kafka",
                "options": {"kafka.bootstrap.servers": self.bootstrap, "topic": self.topic,
                            "sparkeos.stagingDir": os.path.join(workdir, "staging"),
                            "sparkeos.transactionalIdPrefix": self.prefix,
                            "sparkeos.commitParallelism": "1"},
                "select": ["to_json(struct(*)) AS value"]}

    def format_rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """``to_json(struct(*)) AS value``, as Spark projects the stream."""
        return pa.RecordBatch.from_pydict(
            {"value": [json.dumps(row, separators=(",", ":")) for row in batch.to_pylist()]})



class TestKafkaSinkDirect(AtLeastOnceConformance, TestKafkaSinkStaged):
    """``mode="direct"`` (each task commits its own Kafka transaction with its marker,
    at-least-once): a batch half written by a run that died, replayed on fewer, more
    and the same partitions, in process and through Spark. Nothing may be lost; the
    replay partitioned as before writes nothing twice."""

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        kwargs = {k: v for k, v in spec["kwargs"].items() if k != "staging_dir"}
        return {**spec, "kwargs": {**kwargs, "mode": "direct"}}

    # Through Spark too (``SampledDriverKills`` leaves it to the file sink): the killed
    # worker's producer leaves a transaction open, which the restart must close.
    test_at_least_once_task_killed_then_replayed_with_fewer_partitions = (
        ConnectorConformance.test_at_least_once_task_killed_then_replayed_with_fewer_partitions)

    def leftovers(self, workdir: str) -> list[str] | None:
        return None  # nothing staged; open transactions: test_kafka_pool.py

    def test_at_least_once_replay_partitioned_as_before_loses_nothing(self,
                                                                      workdir: str) -> None:
        super().test_at_least_once_replay_partitioned_as_before_loses_nothing(workdir)
        assert_exactly_once(self.visible_ids(workdir), [1, 2, 3, 4, 5, 6])


class TestKafkaSinkStagedConnect(ConnectConformance, TestKafkaSinkStaged):
    """The staged Kafka sink through Spark Connect: end to end, and the driver killed
    from the task that committed a participant (phase 2 runs in tasks: under Connect,
    in the server's executors). Its first batch runs end to end before the kill and its
    restart runs to the end: the end-to-end case with a restart that finds nothing new
    is the file sink's."""

    driver_kill_points = ("after_first_commit",)
    test_end_to_end_several_batches = None
    # foreachBatch under Connect sees no query ID: the identity rule's other road
    test_at_least_once_queries_with_the_session_checkpoint_lose_nothing = (
        TestKafkaSinkStaged.test_at_least_once_queries_with_the_session_checkpoint_lose_nothing)


@pytest.mark.hdfs
class TestKafkaSinkStagedHdfs(TaskCommitClusterConformance, SampledConformance,
                              CheckpointOnHdfs, TestKafkaSinkStaged):
    """Staging, the query's checkpoint and the commit log on a real HDFS: phase 1
    uploads each attempt's staged file, phase 2 (in other Spark tasks) reads it back
    through WebHDFS. Batches run end to end on HDFS in the cluster case (an executor
    lost in phase 2, then the query run to the end); the local end-to-end case is the
    plain suite's, a driver killed on the cluster the file and PostgreSQL sinks', an
    executor lost in phase 1 the file sink's (those are the protocol's; what is Kafka's
    is the phase-2 tasks lost)."""

    test_end_to_end_several_batches = None
    test_driver_crash_then_restart_on_a_cluster = None
    test_executor_lost_in_phase_1_on_a_cluster = None
    # A Spark retry meeting prepared state on HDFS is TestFileSinkHdfs's; one meeting a
    # prepared Kafka transaction (the broker's fencing) is TestKafkaSinkStaged's.
    test_task_retry_reuses_the_transaction_id = None

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        return {**spec, "kwargs": {**spec["kwargs"], "staging_dir": self.staging(workdir)}}

    def staging(self, workdir: str) -> str:
        return f"{self.hdfs_dir}/staging"

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.hdfs_names(self.staging(workdir))


@pytest.mark.s3
class TestKafkaSinkStagedS3(StoreWireFaultCases, SampledConformance, StagingOnS3,
                            TestKafkaSinkStaged):
    """Staging on an S3-compatible object store: phase 1 PUTs each attempt's staged
    file (its prefix claimed by a conditional PUT), phase 2 (in Spark tasks) reads it
    back; every in-process case (the crash matrix, concurrent attempts, twin commits,
    sweeps) against the store, and a batch end to end (phase 2 in Spark tasks reading
    the store). A task retried after prepare is the in-process matrix's
    ``task_fail_after_prepare`` here: the Spark retry adds nothing the store sees."""

    test_task_retry_reuses_the_transaction_id = None

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.s3_names(self.staging(workdir))


def test_staging_defaults_to_the_query_checkpoint(kafka_bootstrap: str, tmp_path: Any) -> None:
    """Without staging_dir, a staged sink stages under <checkpoint>/sparkeos-staging/<sink
    name>/ (shared wherever the checkpoint is), and the commit log records that path."""
    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic, partitions=2)
    expected = write_input(str(tmp_path / "input"), [list(range(0, 20)), list(range(20, 40))])
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "checkpoint"),
                   sink={"factory": "sparkeos.connectors.kafka:KafkaSink",
                         "kwargs": {"bootstrap_servers": kafka_bootstrap, "topic": topic,
                                    "transactional_id_prefix": unique_name(topic, "t") + "-"}},
                   name="orders")
    result = run_job_process(spec, env={"SPARKEOS_KAFKA_STAGING_DIR": ""})
    assert result.returncode == 0, result.tail()
    visible = [int(json.loads(m.value())["id"]) for m in read_topic(kafka_bootstrap, topic)]
    assert_exactly_once(visible, expected)
    staging = tmp_path / "checkpoint" / "sparkeos-staging" / "orders"
    assert list(staging.glob(".driver-mark-*")), "the sink did not stage there"
    log = CommitLog(open_store(sink_log_location(spec.checkpoint, "orders")))
    assert log.read_meta()["description"]["staging_dir"] == str(staging)


@pytest.mark.clouds
class TestKafkaSinkStagedAzure(StoreWireFaultCases, StoreCasesOnly, StagingOnCloud,
                               TestKafkaSinkStaged):
    """Staging (and the in-process cases' commit log) on an emulated Azure Blob Storage:
    the store's cases only; the whole matrix on a store is the S3 variant's (one
    write-once layer)."""

    cloud_name = "azure"
    # The store's races and zombies are the file sink's on Azure (test budget).
    test_two_commits_of_one_transaction_at_every_pair_of_steps = None
    test_zombie_attempt_never_becomes_visible = None

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.cloud_names(self.staging(workdir))
