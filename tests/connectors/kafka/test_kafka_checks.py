"""KafkaSink's checks that need no broker: what is refused before a decision, and the
checks that must fail closed when they cannot decide."""

from __future__ import annotations

from typing import Any

import pytest

from sparkeos.connectors.kafka import KafkaSink, markers, preflight
from sparkeos.core.errors import ConfigurationError, RetriableError


def sink(**overrides: Any) -> KafkaSink:
    return KafkaSink(**{"bootstrap_servers": "127.0.0.1:9", "topic": "out",
                        "staging_dir": "/tmp/sparkeos-unused", **overrides})


def test_a_participant_that_cannot_be_published_within_the_transaction_timeout_is_refused(
) -> None:
    """A participant's publish is one Kafka transaction: one the broker would abort at
    transaction.timeout.ms on every retry must not be decided (it would be stuck)."""
    small = {"mode": "staged", "rows": 10, "bytes": 1_000}
    huge = {"mode": "staged", "rows": 10**7, "bytes": 600 * 10**6}
    sink(transaction_timeout_ms=60_000).before_decision(3, [small, small])
    with pytest.raises(ConfigurationError, match=r"outlast transaction\.timeout\.ms") as info:
        sink(transaction_timeout_ms=60_000).before_decision(3, [small, huge])
    assert "writers" in str(info.value) and "nothing of this batch was sent" in str(info.value)
    sink(transaction_timeout_ms=900_000).before_decision(3, [small, huge])  # 15 min: fits
    sink(mode="direct").before_decision(3, [huge])  # committed by its task: no publish


def test_the_lost_checkpoint_guard_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable marker topic (timeout, denied, a transaction left open on it) is
    not "no other output": the batch stops with the reason, and the check runs again
    on the next one (it was "no other output" before, and the output was written again).
    """
    def unreadable(*args: Any, **kwargs: Any) -> list[Any]:
        assert kwargs.get("open_transactions") == "fail"
        raise TimeoutError("reading sparkeos-markers: partitions [0] not drained")

    monkeypatch.setattr(markers, "read_topic", unreadable)
    with pytest.raises(RetriableError, match="could not read the progress records") as info:
        sink().output_of_other_queries("q1", "orders")
    assert "existing_output='accept'" in str(info.value)


def test_topics_are_known_per_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic seen on one cluster says nothing about another cluster's (two sinks of
    one process writing to two clusters with one topic name)."""
    asked: list[str] = []

    def available(config: dict[str, Any], topic: str, timeout: float) -> bool:
        asked.append(config["bootstrap.servers"])
        return config["bootstrap.servers"] == "cluster-a:9092"

    monkeypatch.setattr(preflight.clients, "topic_available", available)
    monkeypatch.setattr(preflight, "_known_topics", set())
    sink(bootstrap_servers="cluster-a:9092").require_topics(["events"])
    with pytest.raises(ConfigurationError, match="does not exist on cluster-b"):
        sink(bootstrap_servers="cluster-b:9092").require_topics(["events"])
    assert asked == ["cluster-a:9092", "cluster-b:9092"]


def test_under_an_object_store_checkpoint_staging_goes_on_the_store_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloud job needs no shared POSIX path: without staging_dir a staged sink stages
    under the checkpoint, on the same store (written with conditional writes)."""
    from sparkeos.core.storage.stores.s3 import S3Files

    monkeypatch.delenv("SPARKEOS_KAFKA_STAGING_DIR", raising=False)
    bound = sink(staging_dir=None).for_checkpoint("s3a://lake/ckpt/q1/", "orders")
    assert bound.staging_dir == "s3a://lake/ckpt/q1/sparkeos-staging/orders"
    assert isinstance(bound.staging.files, S3Files) and not bound.shared_paths()
