"""The outbox under one decision (issue 51): orders into a Delta table and their events
into a Kafka topic, one ``SinkGroup``, the real table and the real broker. The process
is killed (simulated, in process) at every point of the protocol, one point per case,
then restarted: after the restart's recovery both hold the same batches, and in the end
every id once in each. Spark's kill -9 of the whole driver runs the example
(integration/examples/test_examples.py::test_kafka_to_delta_and_kafka)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from integration.fixtures.kafka import create_topic, unique_name
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import DRIVER_POINTS, TASK_POINTS, FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SinkGroup
from sparkeos.core.storage.logstores import open_store
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.inprocess import ListRunner

pytest.importorskip("deltalake")

# The table gets each batch in two partitions, the events member in one.
BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8, 9], []]]
ALL_IDS = list(range(1, 10))
CRASHED = 1
"""The batch each case kills the process in."""


@pytest.fixture
def outbox(tmp_path: Any, kafka_bootstrap: str) -> Iterator[dict[str, str]]:
    topic = unique_name(str(tmp_path), "seos-outbox")
    create_topic(kafka_bootstrap, topic, partitions=2)
    yield {"bootstrap": kafka_bootstrap, "topic": topic, "table": str(tmp_path / "orders"),
           "staging": str(tmp_path / "staging"), "log": str(tmp_path / "log"),
           "prefix": unique_name(str(tmp_path), "t") + "-"}
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result()


def group(where: dict[str, str]) -> SinkGroup:
    from sparkeos.connectors.delta import DeltaSink
    from sparkeos.connectors.kafka import KafkaSink

    events = KafkaSink(where["bootstrap"], topic=where["topic"],
                       staging_dir=where["staging"], transactional_id_prefix=where["prefix"])
    return SinkGroup({"orders": DeltaSink(where["table"]), "events": events})


def in_table(where: dict[str, str]) -> list[int]:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(where["table"]):
        return []
    column = DeltaTable(where["table"]).to_pyarrow_table(columns=["id"]).column("id")
    return sorted(int(i) for i in column.to_pylist())


def in_topic(where: dict[str, str]) -> list[int]:
    from sparkeos.connectors.kafka import read_topic

    return sorted(int(json.loads(m.value())["id"])
                  for m in read_topic(where["bootstrap"], where["topic"]))


def coordinator(where: dict[str, str], faults: FaultPlan | None) -> Coordinator:
    log = CommitLog(open_store(where["log"]))
    return Coordinator(group(where), CoordinatorConfig(name="outbox"), log, "outbox-q",
                       faults)


def runners(partitions: list[list[int]]) -> dict[str, ListRunner]:
    return {"orders": ListRunner(partitions),
            "events": ListRunner([[i for p in partitions for i in p]])}


@pytest.mark.parametrize("point", DRIVER_POINTS + TASK_POINTS)
def test_outbox_killed_at_every_point(outbox: dict[str, str], point: str) -> None:
    done: list[int] = []
    crashing = coordinator(outbox, FaultPlan(point, CRASHED, simulate=True))
    with contextlib.suppress(InjectedCrash):  # the process died
        for batch_id, partitions in enumerate(BATCHES):
            crashing.run_batch(batch_id, runners(partitions))
            done.append(batch_id)
    decided = crashing.states()[CRASHED].decided is not None
    before = sorted(i for b in BATCHES[:CRASHED] for p in b for i in p)
    if not decided:  # one decision: neither member shows the batch
        assert in_table(outbox) == in_topic(outbox) == before, point
    restarted = coordinator(outbox, None)
    restarted.recover(runners([]))
    # Recovered: both hold the same batches, each once.
    assert in_table(outbox) == in_topic(outbox), point
    for batch_id, partitions in enumerate(BATCHES):
        if batch_id not in done:
            restarted.run_batch(batch_id, runners(partitions))
    assert_exactly_once(in_table(outbox), ALL_IDS)
    assert_exactly_once(in_topic(outbox), ALL_IDS)
    staged = os.listdir(outbox["staging"]) if os.path.isdir(outbox["staging"]) else []
    assert not [n for n in staged if not n.startswith(".")], staged
