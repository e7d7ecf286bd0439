"""Issue 8, defect 3: a query that stays down longer than the broker's
``offsets.retention.minutes`` with a batch decided but not finished. The marker
offsets of the committed participants expire; the restart must still commit every
participant exactly once (the progress records never expire).

A broker of its own, with ``offsets.retention.minutes=1`` and a one-second expiry
check (``docker/services/kafka.sh`` with ``SPARKEOS_KAFKA_INSTANCE``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from integration.fixtures.kafka import ENV_VAR, ROOT, SCRIPT, create_topic, unique_name
from sparkeos.connectors.kafka import KafkaSink, read_topic
from sparkeos.core.commitlog import CommitLog, LocalStore
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.coordinator import Coordinator
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.inprocess import ListRunner

SHORT_RETENTION = {
    "SPARKEOS_KAFKA_INSTANCE": "short-retention",
    "SPARKEOS_KAFKA_PORT": "39192",
    "SPARKEOS_KAFKA_CONTROLLER_PORT": "39193",
    "SPARKEOS_KAFKA_EXTRA_CONFIG": "offsets.retention.minutes=1\n"
                                   "offsets.retention.check.interval.ms=1000",
}


def _script(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", SCRIPT, command], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, **SHORT_RETENTION})


@pytest.fixture(scope="module")
def short_retention_broker() -> Iterator[str]:
    if os.environ.get(ENV_VAR):
        pytest.skip("needs a broker with a one-minute offsets.retention.minutes of its own")
    started = _script("start")
    if started.returncode != 0:
        pytest.fail(f"could not start the short-retention broker:\n{started.stderr[-3000:]}")
    match = re.search(r"bootstrap=(\S+)", started.stdout)
    assert match, started.stdout
    try:
        yield match.group(1)
    finally:
        from sparkeos.connectors.kafka import clients

        clients.clear_caches()
        _script("stop")


@pytest.mark.chaos
def test_committed_participants_stay_committed_after_their_markers_expired(
        short_retention_broker: str, tmp_path: Any) -> None:
    bootstrap = short_retention_broker
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
    p0 = Coordinator(sink, config, log, "xq")._decided_transactions(decided)[0][0]
    deadline = time.monotonic() + 600
    while sink._committed_batch(p0, "driver") >= 0:
        assert time.monotonic() < deadline, "the marker offset never expired"
        time.sleep(2)
    # The restart recovers: partition 0 is found committed by its progress record.
    metrics = Coordinator(sink, config, log, "xq").run_batch(0, ListRunner(batch))
    assert metrics.outcome == "replayed"
    ids = [json.loads(m.value())["id"] for m in read_topic(bootstrap, topic)]
    assert_exactly_once(ids, [1, 2, 3])
