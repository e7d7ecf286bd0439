"""Kafka -> Spark -> Kafka end to end: Spark's read_committed Kafka source, KafkaSink.

The input topic holds committed and aborted transactions of an upstream producer; the
output must hold every committed input record exactly once (checked by a
``read_committed`` consumer), also when the driver is killed again and again. The same
kills duplicate records with a plain foreachBatch producer.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from confluent_kafka import Producer

from sparkeos.connectors.kafka import read_topic
from sparkeos.testing.conformance import assert_exactly_once

from .conftest import create_topic, unique_name
from .kafka_job import KafkaJobSpec, run_kafka_job

ROWS = 60


def produce_input(bootstrap: str, topic: str) -> list[int]:
    """Committed transactions of 10 records each, with an aborted one between them."""
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"{topic}-upstream"})
    producer.init_transactions(30)
    expected: list[int] = []
    for start in range(0, ROWS, 10):
        producer.begin_transaction()
        for i in range(start, start + 10):
            producer.produce(topic, json.dumps({"id": i}).encode(), str(i).encode())
        producer.commit_transaction(30)
        expected += range(start, start + 10)
        producer.begin_transaction()
        producer.produce(topic, json.dumps({"id": 900_000 + start}).encode())
        producer.flush(10)
        producer.abort_transaction(30)
    return expected


def output_ids(bootstrap: str, topic: str) -> list[int]:
    return [int(json.loads(m.value())["id"]) for m in read_topic(bootstrap, topic)]


@pytest.fixture
def pipeline(kafka_bootstrap: str, tmp_path: Any) -> tuple[KafkaJobSpec, list[int]]:
    source = unique_name(str(tmp_path), "seos-in")
    target = unique_name(str(tmp_path), "seos-out")
    create_topic(kafka_bootstrap, source, partitions=2)
    create_topic(kafka_bootstrap, target, partitions=2)
    expected = produce_input(kafka_bootstrap, source)
    spec = KafkaJobSpec(
        bootstrap=kafka_bootstrap, input_topic=source, output_topic=target,
        checkpoint=os.path.join(tmp_path, "checkpoint"),
        staging_dir=os.path.join(tmp_path, "staging"),
        transactional_id_prefix=unique_name(str(tmp_path), "t") + "-",
        max_offsets_per_trigger=16)
    return spec, expected


def run_to_completion(spec: KafkaJobSpec, restarts: int = 3) -> None:
    for _ in range(restarts):
        result = run_kafka_job(spec)
        if result.returncode == 0:
            return
    raise AssertionError(f"the job did not complete:\n{result.tail()}")


@pytest.mark.chaos
def test_kafka_pipeline_survives_repeated_driver_kills(
        pipeline: tuple[KafkaJobSpec, list[int]]) -> None:
    spec, expected = pipeline
    # The source's offsets against the sink's decision: a kill after it, one in phase 1
    # (the points before the decision and after the commits are the protocol's).
    for fault in ("after_decided@1", "kill_driver_after_first_prepare@2"):
        result = run_kafka_job(spec, fault)
        assert result.crashed, f"{fault} did not crash the driver:\n{result.tail()}"
    run_to_completion(spec)
    assert_exactly_once(output_ids(spec.bootstrap, spec.output_topic), expected)
    # The input ends with an aborted transaction's marker: nothing new to read past it.
    run_to_completion(spec, restarts=1)
    assert_exactly_once(output_ids(spec.bootstrap, spec.output_topic), expected)


@pytest.mark.chaos
def test_plain_foreachbatch_producer_duplicates_under_the_same_kills(
        pipeline: tuple[KafkaJobSpec, list[int]]) -> None:
    spec, expected = pipeline
    spec.mode = "plain"
    assert run_kafka_job(spec, "after_finished@1").crashed  # one kill duplicates a batch
    run_to_completion(spec)
    visible = output_ids(spec.bootstrap, spec.output_topic)
    assert set(visible) == set(expected)
    assert len(visible) > len(expected), "the plain producer was unexpectedly exactly-once"
