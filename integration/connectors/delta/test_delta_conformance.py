"""DeltaSink runs the conformance suite on a Delta table on a local path, on S3 (the
project's local server) and on Azure Blob Storage (Azurite): real Spark, the table read
back with delta-rs."""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

import pytest

from integration.fixtures.clouds import PrefixOnCloud, StoreCasesOnly
from integration.fixtures.hdfs import CheckpointOnHdfs
from integration.fixtures.s3 import CheckpointOnS3
from sparkeos.connectors.delta import DeltaSink
from sparkeos.connectors.delta.stores import (
    storage_options,
    table_files,
    table_uri,
    with_credentials,
)
from sparkeos.core.storage.stores.webhdfs import DEFAULT_WEBHDFS_PORT, WEBHDFS_PORT_ENV
from sparkeos.testing.conformance import (
    FORMAT_CASES,
    MERGED_DRIVER_POINTS,
    CommitCasesOnly,
    ConnectorConformance,
    FormatConformance,
    InProcessConformance,
    SampledConformance,
    SampledDriverKills,
    SampledFormatConformance,
)
from sparkeos.testing.job import JobSpec
from sparkeos.testing.storefaults import StoreWireFaultCases


def ever_added(location: str) -> set[str]:
    """Every file a commit in the table's log added (relative, unescaped): a file a later
    version removed (a merge's rewrite) stays for time travel until a vacuum; a file no
    commit added is a leftover."""
    where = table_files(location)
    added: set[str] = set()
    for name in sorted(where.files.listdir(where.path("_delta_log"))):
        if name.endswith(".json") and name[:-5].isdigit():
            for line in where.read(f"_delta_log/{name}").decode().splitlines():
                action = json.loads(line)
                if "add" in action:
                    added.add(urllib.parse.unquote(action["add"]["path"]))
    return added


class TestDeltaSink(SampledDriverKills, ConnectorConformance):
    soak_batches_default = 200  # a Delta version per batch; checkpoints every 100
    driver_kill_points = MERGED_DRIVER_POINTS  # one table commit per batch
    def table(self, workdir: str) -> str:
        return os.path.join(workdir, "orders")

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.delta:DeltaSink",
                "kwargs": {"path": self.table(workdir)}}

    def sink_factory(self, workdir: str) -> DeltaSink:
        return DeltaSink(self.table(workdir))

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "integration.connectors.delta.plain:plain_delta_writer",
                "kwargs": {"path": self.table(workdir)}}

    def visible_ids(self, workdir: str) -> list[int]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        where = table_files(self.table(workdir))
        try:
            table = DeltaTable(table_uri(where),
                               storage_options=with_credentials(where, storage_options(where)))
        except TableNotFoundError:
            return []
        return [int(i) for i in table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()]

    def leftovers(self, workdir: str) -> list[str] | None:
        where = table_files(self.table(workdir))
        manifests = sorted(where.manifests())
        referenced = ever_added(self.table(workdir))
        stray = sorted(name for name in where.files.listdir(where.root)
                       if name.endswith(".parquet") and name not in referenced)
        staging = where.path("_sparkeos/staging")
        staged = [f"{txn}/{name}" for txn in where.files.listdir(staging)
                  for name in where.files.listdir(f"{staging}/{txn}")]
        return ([f"manifest {m}" for m in manifests] + [f"unreferenced {f}" for f in stray]
                + [f"staged {s}" for s in staged])


class TestDeltaFormat(SampledFormatConformance, TestDeltaSink):
    """The sink through ``writeStream.format("sparkeos-delta")``, end to end (its commit
    runs where the file and SQL formats' do; their suites kill the driver there)."""

    test_driver_crash_then_restart = None

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-delta", "options": {"path": self.table(workdir)}}


class TestDeltaUpsertConformance(InProcessConformance, TestDeltaSink):
    """``key=["id"]`` commits otherwise (rows staged per attempt, merged by key with the
    batch's ``SetTransaction`` in phase 2): the in-process cases, the commit races,
    replays on other partition counts and the lost-checkpoint guard among them. The
    Spark jobs are the append mode's."""

    soak_batches_default = 100  # a kill every 97; the log's checkpoints are the append mode's

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        return {**spec, "kwargs": {**spec["kwargs"], "key": ["id"]}}

    def sink_factory(self, workdir: str) -> DeltaSink:
        return DeltaSink(self.table(workdir), key=["id"])

    def leftovers(self, workdir: str) -> list[str] | None:
        """sparkeos' own state only: an upsert writes no data file into the table itself
        (delta-rs' MERGE does). A MERGE that lost its commit to a twin leaves the files
        delta-rs wrote for it, referenced by no commit, until a VACUUM: a limit of
        delta-rs (docs/connectors/delta.md), not counted here."""
        left = super().leftovers(workdir) or []
        return [entry for entry in left if not entry.startswith("unreferenced ")]


@pytest.mark.s3
class TestDeltaSinkS3(StoreWireFaultCases, SampledConformance, CheckpointOnS3, TestDeltaSink):
    """The table on S3 (the data files by sparkeos' conditional creates, the log by
    delta-rs' own), with the query's checkpoint and commit log there too: the in-process
    cases (the crash matrix, concurrent attempts, twin commits, the lost-checkpoint
    guard) against the store, replies lost after the store applied a write (sparkeos'
    and delta-rs' requests alike go through the fault proxy), and a Spark job end to
    end."""

    # A task retried after it prepared is the in-process matrix's task_fail_after_prepare
    # here, as for the file sink on S3: the Spark retry adds nothing the store sees.
    test_task_retry_reuses_the_transaction_id = None

    def table(self, workdir: str) -> str:
        return f"{self.s3_dir}/orders"


@pytest.mark.s3
class TestDeltaUpsertS3(CommitCasesOnly, CheckpointOnS3, TestDeltaUpsertConformance):
    """Upserts on S3, in process: the staged rows read back from the store for the
    MERGE, and deleted once merged: the crash matrix and the commit's races. The claims,
    zombies and replays are the store's and the replay rule's, which TestDeltaSinkS3 and
    the local upsert suite run; so is the soak."""

    def table(self, workdir: str) -> str:
        return f"{self.s3_dir}/orders"


@pytest.mark.s3
class TestDeltaFormatS3(FormatConformance, TestDeltaSinkS3):
    """``format("sparkeos-delta")`` with the table and the checkpoint on S3, end to end:
    the format's planner and committer reach the store by the endpoint the job's
    session and environment give (both ways of carrying the setting without the
    environment are the file format's S3 suite's). The format's kills, retries and
    replays are TestDeltaFormat's, on a local table."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-delta", "options": {"path": self.table(workdir)}}


for _case in FORMAT_CASES - {"test_end_to_end_several_batches"}:
    setattr(TestDeltaFormatS3, _case, None)


@pytest.mark.hdfs
class TestDeltaSinkHdfs(SampledConformance, CheckpointOnHdfs, TestDeltaSink):
    """The table on HDFS (the data files by sparkeos through WebHDFS, the log by
    delta-rs over the NameNode's RPC), with the query's checkpoint and commit log there
    too: the in-process cases (the crash matrix, concurrent attempts, twin commits, the
    lost-checkpoint guard) against HDFS, and a Spark job end to end, in the foreachBatch
    route and through the format."""

    test_task_retry_reuses_the_transaction_id = None  # as on S3: the in-process matrix's

    def table(self, workdir: str) -> str:
        return f"{self.hdfs_dir}/orders"



@pytest.mark.hdfs
class TestDeltaFormatHdfs(FormatConformance, CheckpointOnHdfs, TestDeltaSink):
    """``format("sparkeos-delta")`` with an ``hdfs://`` path and checkpoint, end to
    end: the format's planner, tasks and committer reach the NameNode as the sink
    does."""

    def table(self, workdir: str) -> str:
        return f"{self.hdfs_dir}/orders"

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-delta", "options": {"path": self.table(workdir)}}

    def job(self, workdir: str, mode: str = "exactly_once", master: str = "local[2]",
            sink: dict[str, Any] | None = None,
            spark_conf: dict[str, str] | None = None) -> JobSpec:
        # A process of its own with the WebHDFS port in its environment and its
        # executors': the format makes its sink in Python workers, and the warm
        # session's were started before the fixture set the port.
        port = os.environ.get(WEBHDFS_PORT_ENV, str(DEFAULT_WEBHDFS_PORT))
        conf = {f"spark.executorEnv.{WEBHDFS_PORT_ENV}": port, **(spark_conf or {})}
        return super().job(workdir, mode, master, sink, conf)


@pytest.mark.clouds
class TestDeltaSinkAzure(StoreWireFaultCases, StoreCasesOnly, PrefixOnCloud, TestDeltaSink):
    """The table on Azure Blob Storage (Azurite): the data files by sparkeos'
    ``If-None-Match: *`` creates, the log by delta-rs' own, the in-process commit log
    there too. The store's cases only (replies lost after Azure applied a write, for
    sparkeos' and delta-rs' requests alike; two commits of one transaction at every pair
    of steps; a zombie attempt): the crash matrix and the races run on the same
    write-once layer in TestDeltaSinkS3."""

    cloud_name = "azure"

    def table(self, workdir: str) -> str:
        return f"{self.cloud_dir}/orders"


@pytest.mark.clouds
class TestDeltaFormatAzure(FormatConformance, PrefixOnCloud, TestDeltaSink):
    """``format("sparkeos-delta")`` with the table on Azure, end to end: the executors
    and the format's committer reach Azurite by the connection string they inherit."""

    cloud_name = "azure"

    def table(self, workdir: str) -> str:
        return f"{self.cloud_dir}/orders"

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-delta", "options": {"path": self.table(workdir)}}


for _case in FORMAT_CASES - {"test_end_to_end_several_batches"}:
    setattr(TestDeltaFormatAzure, _case, None)
    setattr(TestDeltaFormatHdfs, _case, None)


@pytest.mark.s3
def test_a_store_without_conditional_writes_is_refused_before_anything_is_written(
        s3_without_conditional_writes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """delta-rs' log commits and the attempts' claims rest on ``If-None-Match``: a store
    that ignores it would let two commits of one version both win. ``validate`` refuses
    it, and the table's prefix stays empty."""
    import pyarrow as pa

    from sparkeos.core.errors import ConfigurationError

    store = s3_without_conditional_writes
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", store.endpoint)
    location = f"{store.fresh_dir('weak-delta')}/orders"
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        DeltaSink(location).validate(pa.schema([("id", pa.int64())]))
    where = table_files(location)
    assert [n for n in where.files.listdir(where.root) if not n.startswith(".")] == []
