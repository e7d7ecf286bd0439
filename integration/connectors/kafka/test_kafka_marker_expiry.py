"""Issue 8, defect 3: a query that stays down longer than the broker's
``offsets.retention.minutes`` with a batch decided but not finished. The marker
offsets of the committed participants expire; the restart must still commit every
participant exactly once (the progress records never expire).

The broker's expiry is played by deleting the marker's consumer group: what the sink
then reads (no committed offset) is what it reads after an expiry, without waiting
for the retention, whose smallest setting is a whole minute."""

from __future__ import annotations

import json
from typing import Any

import pytest

from integration.fixtures.kafka import create_topic, unique_name
from sparkeos.connectors.kafka import KafkaSink, read_topic
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import LocalStore
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.inprocess import ListRunner


def expire_marker(bootstrap: str, group: str) -> None:
    """Remove ``group``'s committed offsets as the broker's expiry does."""
    from confluent_kafka.admin import AdminClient

    from sparkeos.connectors.kafka import clients

    clients.clear_caches()  # the sink's marker consumer: an empty group can be deleted
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_consumer_groups([group], request_timeout=30)[group].result(timeout=30)


@pytest.mark.chaos
def test_committed_participants_stay_committed_after_their_markers_expired(
        strict_kafka: str, tmp_path: Any) -> None:
    bootstrap = strict_kafka
    topic = unique_name(str(tmp_path))
    create_topic(bootstrap, topic, partitions=2)
    sink = KafkaSink(bootstrap, topic=topic, staging_dir=str(tmp_path / "staging"),
                     transactional_id_prefix=unique_name(str(tmp_path), "t") + "-",
                     timeout_s=20.0)
    log = CommitLog(LocalStore(str(tmp_path / "log")))
    config = CoordinatorConfig(name="expiry")
    batch = [[1, 2], [3]]
    # Partition 0 commits, then the driver dies: batch 0 is decided, not finished.
    with pytest.raises(InjectedCrash):
        Coordinator(sink, config, log, "xq", FaultPlan("after_first_commit", 0, simulate=True)
                    ).run_batch(0, ListRunner(batch))
    ids = [json.loads(m.value())["id"] for m in read_topic(bootstrap, topic)]
    assert sorted(ids) == [1, 2]
    # The query stays down until the broker has dropped partition 0's marker offset.
    decided = log.batches()[0]
    _member, p0, _receipt = Coordinator(sink, config, log, "xq")._decided_transactions(decided)[0]
    assert sink._committed_batch(p0, "driver") == 0
    expire_marker(bootstrap, sink.marker_group(p0))
    assert sink._committed_batch(p0, "driver") == -1, "the marker offset is still there"
    # The restart recovers: partition 0 is found committed by its progress record.
    metrics = Coordinator(sink, config, log, "xq").run_batch(0, ListRunner(batch))
    assert metrics.outcome == "replayed"
    ids = [json.loads(m.value())["id"] for m in read_topic(bootstrap, topic)]
    assert_exactly_once(ids, [1, 2, 3])
