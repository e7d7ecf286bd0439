"""Kafka -> Spark's real-time mode -> Kafka through ``exactly_once_writer``: the driver's
whole process tree killed at each point of an epoch's task while records keep arriving
(so a replayed epoch ends elsewhere than the attempt that committed), then restarted;
a ``read_committed`` reader sees every record once. The same kills duplicate records
through a plain ForeachWriter."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest

from sparkeos.connectors.kafka import KafkaSink, read_topic
from sparkeos.core.faults import REALTIME_POINTS
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
    for epoch, point in enumerate(REALTIME_POINTS, start=2):
        result = run_realtime_job(spec, fault=f"{point}@{epoch}")
        assert result.crashed, f"{point}@{epoch} did not fire:\n{result.tail()}"
        seen = output_ids(spec)
        assert all(count == 1 for count in seen.values()), (point, seen.most_common(3))
    result = run_realtime_job(spec)
    assert result.returncode == 0, result.tail()
    seen = output_ids(spec)
    assert sorted(seen) == list(range(spec.total)), sorted(set(range(spec.total)) - set(seen))
    assert max(seen.values()) == 1, seen.most_common(3)


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
