"""DeltaSink runs the conformance suite on a local Delta table: real Spark, the table
read back with delta-rs."""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

from sparkeos.connectors.delta import DeltaSink
from sparkeos.testing.conformance import (
    MERGED_DRIVER_POINTS,
    ConnectorConformance,
    InProcessConformance,
    SampledDriverKills,
    SampledFormatConformance,
)


def ever_added(root: str) -> set[str]:
    """Every file a commit in the table's log added (relative, unescaped): a file a later
    version removed (a merge's rewrite) stays for time travel until a vacuum; a file no
    commit added is a leftover."""
    log = os.path.join(root, "_delta_log")
    added: set[str] = set()
    for name in sorted(os.listdir(log)) if os.path.isdir(log) else []:
        if name.endswith(".json") and name[:-5].isdigit():
            with open(os.path.join(log, name)) as fh:
                for line in fh:
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

        if not DeltaTable.is_deltatable(self.table(workdir)):
            return []
        return [int(i) for i in DeltaTable(self.table(workdir)).to_pyarrow_table(
            columns=["id"]).column("id").to_pylist()]

    def leftovers(self, workdir: str) -> list[str] | None:
        root = self.table(workdir)
        attempts = os.path.join(root, "_sparkeos", "attempts")
        manifests = sorted(os.listdir(attempts)) if os.path.isdir(attempts) else []
        referenced = ever_added(root)
        stray = sorted(name for name in (os.listdir(root) if os.path.isdir(root) else [])
                       if name.endswith(".parquet") and name not in referenced)
        return [f"manifest {m}" for m in manifests] + [f"unreferenced {f}" for f in stray]


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
