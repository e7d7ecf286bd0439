"""IcebergSink runs the conformance suite on an Iceberg table in a SQL catalog on
SQLite, the table on a local path, on S3 (the project's local server), on Google Cloud
Storage (fake-gcs-server) and on Azure Blob Storage (Azurite): real Spark, the table
read back with pyiceberg."""

from __future__ import annotations

import os
from typing import Any

import pytest

from integration.fixtures.clouds import PrefixOnCloud, StoreCasesOnly
from integration.fixtures.s3 import CheckpointOnS3
from sparkeos.connectors.iceberg import IcebergSink
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
from sparkeos.testing.storefaults import StoreWireFaultCases

TABLE = "db.orders"


class TestIcebergSink(SampledDriverKills, ConnectorConformance):
    soak_batches_default = 100  # a snapshot and a metadata file per batch; kills every 97
    driver_kill_points = MERGED_DRIVER_POINTS  # one table commit per batch
    def catalog(self, workdir: str) -> dict[str, str]:
        os.makedirs(os.path.join(workdir, "warehouse"), exist_ok=True)
        return {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db",
                "warehouse": f"file://{workdir}/warehouse"}

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.iceberg:IcebergSink",
                "kwargs": {"table": TABLE, "catalog": self.catalog(workdir)}}

    def sink_factory(self, workdir: str) -> IcebergSink:
        return IcebergSink(TABLE, catalog=self.catalog(workdir))

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "integration.connectors.iceberg.plain:plain_iceberg_writer",
                "kwargs": {"table": TABLE, "catalog": self.catalog(workdir)}}

    def reader(self, workdir: str) -> IcebergSink:
        """The sink the test reads the table back through."""
        return self.sink_factory(workdir)

    def visible_ids(self, workdir: str) -> list[int]:
        found = self.reader(workdir)._load()
        if found is None:
            return []
        return [int(i) for i in found.scan(selected_fields=("id",)).to_arrow()
                .column("id").to_pylist()]

    def leftovers(self, workdir: str) -> list[str] | None:
        from sparkeos.connectors.iceberg import files, table

        reader = self.reader(workdir)
        found = reader._load()
        if found is None:
            return []
        location = str(found.location())
        where = reader.store.table_files(files.table_location(location))
        manifests = sorted(where.manifests())
        on_disk = [f"{location}/{name}" for name in _parquet_files(where, "data")]
        referenced = table.referenced(found, on_disk)
        stray = sorted(uri for uri in on_disk if uri not in referenced)
        staging = where.path("_sparkeos/staging")
        staged = [f"{txn}/{name}" for txn in where.files.listdir(staging)
                  for name in where.files.listdir(f"{staging}/{txn}")]
        return ([f"manifest {m}" for m in manifests] + [f"unreferenced {f}" for f in stray]
                + [f"staged {s}" for s in staged])


def _parquet_files(where: Any, directory: str) -> list[str]:
    """The Parquet files under ``directory`` of the table, in its partitions'
    directories (``name=value``) too."""
    found = []
    for name in where.files.listdir(where.path(directory)):
        if name.endswith(".parquet"):
            found.append(f"{directory}/{name}")
        elif "=" in name:
            found.extend(_parquet_files(where, f"{directory}/{name}"))
    return found


class TestIcebergFormat(SampledFormatConformance, TestIcebergSink):
    """The sink through ``writeStream.format("sparkeos-iceberg")``, end to end (its
    commit runs where the file and SQL formats' do; their suites kill the driver
    there)."""

    test_driver_crash_then_restart = None

    def format_spec(self, workdir: str) -> dict[str, Any]:
        options = {"path": TABLE, **{f"sparkeos.catalog.{k}": v
                                     for k, v in self.catalog(workdir).items()}}
        return {"format": "sparkeos-iceberg", "options": options}


class Partitioned:
    """The table partitioned by a bucket of the id (the suite's rows' one column that
    varies): each attempt's rows split into up to three files."""

    partition_by = ("bucket(3, id)",)

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)  # type: ignore[misc]
        return {**spec, "kwargs": {**spec["kwargs"], "partition_by": self.partition_by}}

    def sink_factory(self, workdir: str) -> IcebergSink:
        return IcebergSink(TABLE, catalog=self.catalog(workdir),  # type: ignore[attr-defined]
                           partition_by=self.partition_by)

    def format_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().format_spec(workdir)  # type: ignore[misc]
        return {**spec, "options": {**spec["options"],
                                    "sparkeos.partitionBy": ",".join(self.partition_by)}}

    def visible_ids(self, workdir: str) -> list[int]:
        found = self.reader(workdir)._load()  # type: ignore[attr-defined]
        if found is not None:
            assert [str(f.transform) for f in found.spec().fields] == ["bucket[3]"]
        return super().visible_ids(workdir)  # type: ignore[misc, no-any-return]


class TestIcebergSinkPartitioned(InProcessConformance, Partitioned, TestIcebergSink):
    """The in-process cases on a partitioned table: each attempt's rows split into a
    file per partition (the crash matrix, concurrent attempts, the commit's races, the
    replays partitioned otherwise)."""


class TestIcebergFormatPartitioned(Partitioned, TestIcebergFormat):
    """``.option("sparkeos.partitionBy", "bucket(3, id)")`` through Spark, end to end
    and replayed on another partition count."""


for _case in [name for name in dir(TestIcebergFormatPartitioned) if name.startswith("test_")
              and name not in ("test_end_to_end_several_batches",
                               "test_exactly_once_replay_partitioned_otherwise")]:
    setattr(TestIcebergFormatPartitioned, _case, None)


class TestIcebergUpsertConformance(InProcessConformance, TestIcebergSink):
    """``key=["id"]`` commits otherwise (rows staged per attempt, merged by key with the
    batch's property in phase 2): the in-process cases, the commit races, replays on
    other partition counts and the lost-checkpoint guard among them. The Spark jobs are
    the append mode's."""

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        return {**spec, "kwargs": {**spec["kwargs"], "key": ["id"]}}

    def sink_factory(self, workdir: str) -> IcebergSink:
        return IcebergSink(TABLE, catalog=self.catalog(workdir), key=["id"])


class OnS3(CheckpointOnS3):
    """The catalog's warehouse on S3 (its SQLite database stays local: it is the
    catalog, not the table), with the query's checkpoint and commit log."""

    def catalog(self, workdir: str) -> dict[str, str]:
        return {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db",
                "warehouse": f"{self.s3_dir}/warehouse"}

    def reader(self, workdir: str) -> IcebergSink:
        # Straight to the store, not through a test's fault proxy.
        return IcebergSink(TABLE, catalog={**self.catalog(workdir),
                                           "s3.endpoint": self.s3_endpoint})


@pytest.mark.s3
class TestIcebergSinkS3(StoreWireFaultCases, SampledConformance, OnS3, TestIcebergSink):
    """The table on S3: the data files and the attempts' manifests by sparkeos'
    conditional creates, the metadata by pyiceberg's FileIO, with the endpoint sparkeos
    resolved: the in-process cases, replies lost after the store applied a write
    (sparkeos' and pyiceberg's requests through the fault proxy), and a Spark job end to
    end."""

    # A task retried after it prepared is the in-process matrix's task_fail_after_prepare
    # here, as for the file sink on S3: the Spark retry adds nothing the store sees.
    test_task_retry_reuses_the_transaction_id = None


@pytest.mark.s3
class TestIcebergUpsertS3(CommitCasesOnly, OnS3, TestIcebergUpsertConformance):
    """Upserts on S3, in process: the staged rows read back from the store for the
    merge, and deleted once merged: the crash matrix and the commit's races (the rest
    as TestDeltaUpsertS3 says)."""


@pytest.mark.s3
class TestIcebergFormatS3(FormatConformance, TestIcebergSinkS3):
    """``format("sparkeos-iceberg")`` with the warehouse and the checkpoint on S3, end
    to end (the format's kills, retries and replays are TestIcebergFormat's)."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        options = {"path": TABLE, **{f"sparkeos.catalog.{k}": v
                                     for k, v in self.catalog(workdir).items()}}
        return {"format": "sparkeos-iceberg", "options": options}


for _case in FORMAT_CASES - {"test_end_to_end_several_batches"}:
    setattr(TestIcebergFormatS3, _case, None)


class OnCloud(PrefixOnCloud):
    """The catalog's warehouse on the emulated store ``cloud_name`` (the SQLite database
    stays local), with the in-process cases' commit log there."""

    def catalog(self, workdir: str) -> dict[str, str]:
        return {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db",
                "warehouse": f"{self.cloud_dir}/warehouse"}


class IcebergSinkOnCloud(StoreCasesOnly, OnCloud, TestIcebergSink):
    """The table on GCS or Azure: the data files and the attempts' manifests by
    sparkeos' conditional creates, the metadata by pyiceberg's FileIO (sparkeos' own
    subclass) at the endpoint sparkeos resolved, the table read back through it: two
    commits of one transaction at every pair of steps, and a zombie attempt. The crash
    matrix and the races run on the same write-once layer in TestIcebergSinkS3.

    Not the lost replies through the fault proxy: Arrow's GCS and Azure clients
    (pyiceberg's FileIO) wait on the store while they hold the GIL (measured on pyarrow
    26: a GCS file opened on its first read, under ``NativeFile.closed``; an Azure
    upload finished in ``close()``), so the proxy, a thread of the test's process, can
    never answer them. Lost replies and 503s on both stores are proven for sparkeos' own
    requests by the file sink's and TestDeltaSinkAzure's cases."""


@pytest.mark.clouds
class TestIcebergSinkGcs(IcebergSinkOnCloud):
    cloud_name = "gcs"


@pytest.mark.clouds
class TestIcebergSinkAzure(IcebergSinkOnCloud):
    cloud_name = "azure"


@pytest.mark.clouds
class TestIcebergUpsertAzure(CommitCasesOnly, OnCloud, TestIcebergUpsertConformance):
    """Upserts on Azure, in process: pyiceberg's delete by key reads the table's data
    files through sparkeos' FileIO (the container's path Arrow needs), the staged rows
    read back from the store: the crash matrix and the commit's races."""

    cloud_name = "azure"


class IcebergFormatOnCloud(FormatConformance, OnCloud, TestIcebergSink):
    """``format("sparkeos-iceberg")`` with the warehouse on GCS or Azure, end to end:
    every process opens pyiceberg's FileIO with the endpoint the driver resolved and the
    credentials of its own environment."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        options = {"path": TABLE, **{f"sparkeos.catalog.{k}": v
                                     for k, v in self.catalog(workdir).items()}}
        return {"format": "sparkeos-iceberg", "options": options}


@pytest.mark.clouds
class TestIcebergFormatGcs(IcebergFormatOnCloud):
    cloud_name = "gcs"


@pytest.mark.clouds
class TestIcebergFormatAzure(IcebergFormatOnCloud):
    cloud_name = "azure"


for _case in FORMAT_CASES - {"test_end_to_end_several_batches"}:
    setattr(TestIcebergFormatGcs, _case, None)
    setattr(TestIcebergFormatAzure, _case, None)
