"""The file sink runs the conformance suite on real Spark."""

from __future__ import annotations

import os
from typing import Any

from sparkeos.connectors.file import read_output
from sparkeos.connectors.file.sink import STAGING_DIR
from sparkeos.testing.conformance import ConnectConformance, ConnectorConformance


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


class TestFileSinkConnect(ConnectConformance, TestFileSinkParquet):
    """The file sink through Spark Connect: end to end, and the driver killed."""
