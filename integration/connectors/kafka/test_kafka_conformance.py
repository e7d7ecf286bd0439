"""The staged KafkaSink runs the conformance suite on real Spark and a real broker.

``visible_ids`` is what a ``read_committed`` consumer sees in the output topic: the
value of every record is the input row as JSON (``{"id": ..., "payload": ...}``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from sparkeos.connectors.kafka import read_topic
from sparkeos.testing.conformance import ConnectConformance, ConnectorConformance

from .conftest import create_topic, unique_name


class TestKafkaSinkStaged(ConnectorConformance):
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


class TestKafkaSinkStagedConnect(ConnectConformance, TestKafkaSinkStaged):
    """The staged Kafka sink through Spark Connect: end to end, and the driver
    killed."""
