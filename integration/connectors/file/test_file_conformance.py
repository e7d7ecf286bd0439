"""The file sink runs the conformance suite on real Spark."""

from __future__ import annotations

import os
from typing import Any

import pytest

from integration.fixtures.hdfs import CheckpointOnHdfs
from integration.fixtures.s3 import PrefixOnS3
from sparkeos.connectors.file import read_output
from sparkeos.connectors.file.sink import STAGING_DIR
from sparkeos.core.commitlog import CommitLog, open_store, sink_log_location
from sparkeos.testing.conformance import (
    ClusterConformance,
    ConnectConformance,
    ConnectorConformance,
    SampledConformance,
    assert_exactly_once,
)
from sparkeos.testing.job import JobSpec, run_job, run_job_process, write_input


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

    soak_batches_default = 1000


class TestFileSinkConnect(ConnectConformance, TestFileSinkParquet):
    """The file sink through Spark Connect: end to end, and the driver killed."""


@pytest.mark.chaos
def test_driver_kills_with_batches_coalesced_to_the_writers(tmp_path: Any) -> None:
    """Batches of 6 partitions on local[2] are written by 2 participants (the default
    writers): a driver killed before and after the decision, then a restart, still
    leaves every id exactly once."""
    input_ids = [list(range(b * 100, b * 100 + 60)) for b in range(4)]
    expected = write_input(str(tmp_path / "input"), input_ids)
    out = str(tmp_path / "output")
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "ckpt"),
                   sink={"factory": "sparkeos.connectors.file:FileSink",
                         "kwargs": {"path": out}}, partitions=6)
    for fault in ("kill_driver_after_first_prepare@1", "after_decided@2"):
        assert run_job_process(spec, fault).crashed, fault
    assert run_job(spec).returncode == 0
    assert_exactly_once(read_output(out).column("id").to_pylist(), expected)
    states = CommitLog(open_store(sink_log_location(str(tmp_path / "ckpt"), "conformance")))
    for state in states.batches().values():
        if state.decided is not None:
            assert len(state.decided["participants"]) <= 2


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
class TestFileSinkHdfsConnect(ConnectConformance, TestFileSinkHdfs):
    """On HDFS through Spark Connect, end to end: the commit log reached from Python
    (WebHDFS). The driver kills run in classic mode on HDFS and through Connect on
    local paths."""

    test_driver_crash_then_restart = None
    test_end_to_end_several_batches = ConnectorConformance.test_end_to_end_several_batches


@pytest.mark.s3
class TestFileSinkS3(SampledConformance, PrefixOnS3, TestFileSinkParquet):
    """The file sink with its output on an S3-compatible object store: staging, claims
    and publishing by conditional writes (``core.objectstore``); every in-process case
    (the crash matrix, concurrent attempts, twin commits) against the store, and a
    batch end to end in Spark. A task retried after it prepared is the in-process
    matrix's ``task_fail_after_prepare`` here: the Spark retry adds nothing the store
    sees."""

    test_task_retry_reuses_the_transaction_id = None

    def output(self, workdir: str) -> str:
        return f"{self.s3_dir}/output"

    def leftovers(self, workdir: str) -> list[str] | None:
        return self.s3_names(f"{self.output(workdir)}/{STAGING_DIR}")


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
