"""IcebergSink runs the conformance suite on an Iceberg table in a SQL catalog on
SQLite: real Spark, the table read back with pyiceberg."""

from __future__ import annotations

import os
from typing import Any

from sparkeos.connectors.iceberg import IcebergSink
from sparkeos.testing.conformance import (
    MERGED_DRIVER_POINTS,
    ConnectorConformance,
    InProcessConformance,
    SampledDriverKills,
    SampledFormatConformance,
)

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

    def visible_ids(self, workdir: str) -> list[int]:
        found = self.sink_factory(workdir)._load()
        if found is None:
            return []
        return [int(i) for i in found.scan(selected_fields=("id",)).to_arrow()
                .column("id").to_pylist()]

    def leftovers(self, workdir: str) -> list[str] | None:
        from sparkeos.connectors.iceberg import table

        found = self.sink_factory(workdir)._load()
        if found is None:
            return []
        root = str(found.location()).removeprefix("file://")
        attempts = os.path.join(root, "_sparkeos", "attempts")
        manifests = sorted(os.listdir(attempts)) if os.path.isdir(attempts) else []
        on_disk = [f"file://{os.path.join(directory, name)}"
                   for directory, _, names in os.walk(os.path.join(root, "data"))
                   for name in names if name.endswith(".parquet")]
        referenced = table.referenced(found, on_disk)
        stray = sorted(uri for uri in on_disk if uri not in referenced)
        return [f"manifest {m}" for m in manifests] + [f"unreferenced {f}" for f in stray]


class TestIcebergFormat(SampledFormatConformance, TestIcebergSink):
    """The sink through ``writeStream.format("sparkeos-iceberg")``, end to end (its
    commit runs where the file and SQL formats' do; their suites kill the driver
    there)."""

    test_driver_crash_then_restart = None

    def format_spec(self, workdir: str) -> dict[str, Any]:
        options = {"path": TABLE, **{f"sparkeos.catalog.{k}": v
                                     for k, v in self.catalog(workdir).items()}}
        return {"format": "sparkeos-iceberg", "options": options}


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
