"""Kafka -> Spark's real-time mode -> Kafka through ``exactly_once_writer``, while records
keep arriving (so a replayed epoch ends elsewhere than the attempt that committed): a
Python worker killed in the middle of an epoch, the driver's whole process tree killed at
each point of an epoch's task and at a random moment, each restarted; a
``read_committed`` reader sees every record once. The same kill duplicates records
through a plain ForeachWriter."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from sparkeos.connectors.kafka import KafkaSink, read_topic
from sparkeos.core.faults import REALTIME_POINTS, WORKER_EPOCH_POINT
from sparkeos.testing.conformance.realtime import EpochConformance

from .conftest import create_topic, unique_name
from .realtime_job import RealTimeJobSpec, run_realtime_job


def output_ids(spec: RealTimeJobSpec) -> Counter[int]:
    return Counter(int(json.loads(m.value())["id"])
                   for m in read_topic(spec.bootstrap, spec.output_topic, timeout_s=60))


@pytest.fixture
def spec(kafka_bootstrap: str, tmp_path: Any) -> RealTimeJobSpec:
    source = unique_name(str(tmp_path), "seos-rt-in")
    target = unique_name(str(tmp_path), "seos-rt-out")
    create_topic(kafka_bootstrap, source, partitions=2)
    create_topic(kafka_bootstrap, target, partitions=2)
    return RealTimeJobSpec(bootstrap=kafka_bootstrap, input_topic=source,
                           output_topic=target,
                           checkpoint=os.path.join(tmp_path, "checkpoint"))


@pytest.mark.chaos
def test_every_record_once_after_kills_at_each_point_of_an_epoch(
        spec: RealTimeJobSpec) -> None:
    def no_duplicate(after: str) -> None:
        seen = output_ids(spec)
        assert all(count == 1 for count in seen.values()), (after, seen.most_common(3))

    # A Python worker killed in the middle of the first epoch's writes: the driver lives
    # and sees the task fail (local mode retries no task: the query fails; restarted).
    result = run_realtime_job(spec, fault=WORKER_EPOCH_POINT)
    assert "Python worker killed" in result.stderr and not result.crashed, result.tail()
    no_duplicate(WORKER_EPOCH_POINT)
    # At each point of an epoch: each run's first epoch, the replay of one killed before
    # (rows of partition 0 are left uncommitted by each kill, so the next run writes).
    for point in REALTIME_POINTS:
        result = run_realtime_job(spec, fault=point)
        assert result.crashed, f"{point} did not fire:\n{result.tail()}"
        no_duplicate(point)
        if point == "epoch_mid_write":
            status_and_recover_end_the_open_epoch(spec)
    # The whole tree killed at a moment no step chose: in the start, an epoch's reads,
    # writes or commit, or Spark's own logs; or never, if the run ends first (the seed
    # gives the delay, not the moment relative to Spark's).
    seed = random.randrange(2**32)
    delay = random.Random(seed).uniform(8.0, 20.0)
    result = run_realtime_job(spec, kill_after_s=delay)
    print(f"seed={seed}: {'killed' if 'timeout' in result.stderr else 'ended'} "
          f"after {delay:.1f} s")
    assert result.returncode == 0 or "timeout" in result.stderr, result.tail()
    no_duplicate(f"seed={seed}")
    result = run_realtime_job(spec)
    assert result.returncode == 0, result.tail()
    seen = output_ids(spec)
    assert sorted(seen) == list(range(spec.total)), sorted(set(range(spec.total)) - set(seen))
    assert max(seen.values()) == 1, seen.most_common(3)


@pytest.mark.chaos
@pytest.mark.connect
def test_every_record_once_through_spark_connect(spec: RealTimeJobSpec) -> None:
    """Real-time mode runs on Spark Connect: the writer is made in the client, pickled
    to the server's tasks, which read the query's run ID and checkpoint as in a classic
    session. The server's whole process group killed right after a commit, restarted,
    run to the end: every record once."""
    on_connect = RealTimeJobSpec(**{**spec.__dict__, "connect": True, "total": 1000})
    result = run_realtime_job(on_connect, fault="epoch_after_commit")
    assert result.crashed, result.tail()
    result = run_realtime_job(on_connect)
    assert result.returncode == 0, result.tail()
    seen = output_ids(on_connect)
    assert sorted(seen) == list(range(on_connect.total)), \
        sorted(set(range(on_connect.total)) - set(seen))
    assert max(seen.values()) == 1, seen.most_common(3)


def status_and_recover_end_the_open_epoch(spec: RealTimeJobSpec) -> None:
    """The query died with partition 0's epoch transaction open (it holds
    ``read_committed`` readers back): ``sparkeos status`` shows the writer's partitions
    and marks; ``recover`` refuses without ``--force`` (no lease tells a running query in
    this mode), and with it fences them: no open transaction is left."""
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sparkeos.cli", *args, spec.checkpoint],
                              capture_output=True, text=True, timeout=120)

    status = cli("status", "--probe")
    assert status.returncode == 0, status.stderr
    assert "real-time writer" in status.stdout and "partitions opened: 2" in status.stdout, \
        status.stdout
    assert "partition 0: " in status.stdout and "probe:" not in status.stdout, status.stdout
    refused = cli("recover")
    assert refused.returncode == 2 and "stop the query" in refused.stderr, refused.stderr
    recovered = cli("recover", "--force")
    assert recovered.returncode == 0 and "fenced 4 participants" in recovered.stdout, \
        recovered.stdout + recovered.stderr
    # Raises TimeoutError while a transaction is open (the sink's timeout is 10 minutes).
    read_topic(spec.bootstrap, spec.output_topic, open_transactions="fail", timeout_s=60)


@pytest.mark.chaos
def test_a_plain_foreach_writer_duplicates_under_the_same_kill(
        spec: RealTimeJobSpec) -> None:
    plain = RealTimeJobSpec(**{**spec.__dict__, "mode": "plain"})
    assert run_realtime_job(plain, fault="epoch_after_commit@2").crashed
    assert run_realtime_job(plain).returncode == 0
    seen = output_ids(plain)
    assert set(seen) == set(range(plain.total))
    assert max(seen.values()) > 1, "the kill left no duplicate: the test cannot fail"


class TestKafkaEpochs(EpochConformance):
    """KafkaSink's epoch participant in process, against the broker."""

    @pytest.fixture(autouse=True)
    def topic(self, kafka_bootstrap: str, workdir: str) -> None:
        self.bootstrap = kafka_bootstrap
        self.topic_name = unique_name(workdir, "seos-rt-epochs")
        create_topic(kafka_bootstrap, self.topic_name, partitions=2)

    def make_sink(self, workdir: str) -> KafkaSink:
        return KafkaSink(self.bootstrap, topic=self.topic_name, key_column="key",
                         value_column="value")

    def visible_ids(self, workdir: str) -> list[int]:
        return [int(json.loads(m.value())["id"])
                for m in read_topic(self.bootstrap, self.topic_name, timeout_s=60)]
