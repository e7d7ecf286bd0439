"""What is checked against the brokers before a batch is decided.

Before the first batch of a sink configuration (``check_broker``, once per process):
the brokers answer, ``transaction_timeout_ms`` is within the broker's
``transaction.max.timeout.ms``, the marker topic exists (created compacted on first use)
and is compacted only, and the fixed output topic exists or will be created. Before a
task prepares (``require_topics``, in direct mode before it produces): every per-row
topic exists. Before the decision
(``check_publish_budget``): the largest participant can be published within one Kafka
transaction. Each refuses with a ``ConfigurationError`` naming the fix, while nothing of
the batch is visible yet; a check that cannot decide (brokers down) raises
``RetriableError``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, RetriableError
from sparkeos.core.protocol import Receipt, Transaction

from . import clients
from .config import KafkaConfig
from .errors import short

MARKER_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
BROKER_MAX_TXN_TIMEOUT = "transaction.max.timeout.ms"
PUBLISH_BUDGET = 0.8
"""The share of transaction.timeout.ms a participant's publish may take at the slowest
rate the sink assumes (the rest is for connecting, the marker and the commit)."""
_validated: set[str] = set()
_validated_lock = threading.Lock()
_known_topics: set[tuple[str, str]] = set()
"""(cluster, topic) seen to exist in this process (per-row topics are checked once
each; two clusters may both have a topic of one name, or only one of them)."""


def check_broker_once(config: KafkaConfig) -> None:
    """``check_broker`` unless this process already passed it for these settings."""
    key = clients.fingerprint({**config.client_config(), "#marker": config.marker_topic,
                               "#announce": config.announces_open,
                               "#topic": config.topic, "#ttms": config.transaction_timeout_ms})
    with _validated_lock:
        if key in _validated:
            return
    check_broker(config)
    with _validated_lock:
        _validated.add(key)


def check_broker(config: KafkaConfig) -> None:
    """Reachability, ``transaction.timeout.ms`` limit, marker and output topics."""
    try:
        # A client that is closed right away: one left behind would go on trying to
        # reach an unreachable broker (and logging it) for the rest of the process.
        clients.probe_brokers(config.client_config(), config.timeout_s)
        admin = clients.admin_client(config.client_config())
        metadata = admin.list_topics(timeout=config.timeout_s)
    except Exception as exc:
        clients.drop_admin(config.client_config())
        raise RetriableError(
            f"the Kafka brokers at {config.bootstrap} did not answer within "
            f"{config.timeout_s:g} s ({short(exc)})",
            fix="start the brokers or fix bootstrap_servers / the security settings in "
            "producer_config; nothing of this batch was written",
        ) from None
    _check_transaction_timeout(config, _broker_config(config, admin, metadata))
    if config.marker_topic not in metadata.topics:
        _create_marker_topic(config, admin, len(metadata.brokers))
    else:
        _check_marker_topic(config, admin)
    if config.announces_open and config.announce_topic not in metadata.topics:
        _create_announce_topic(config, admin, len(metadata.brokers))
    if config.topic is not None and config.topic not in metadata.topics:
        require_topics(config, [config.topic])


def require_topics(config: KafkaConfig, topics: Sequence[str],
                   txn: Transaction | None = None) -> None:
    """Every topic exists, or the brokers create it on first use; else a
    ``ConfigurationError`` naming it, before the batch is decided (a commit to a
    missing topic would time out after the decision, the batch stuck until the
    topic appears)."""
    for topic in topics:
        if (config.bootstrap_servers, topic) in _known_topics:
            continue
        if not clients.topic_available(config.client_config(), topic, config.timeout_s):
            raise ConfigurationError(
                f"topic {topic!r} does not exist on {config.bootstrap} and the brokers do "
                "not create topics automatically",
                sink=txn.sink if txn else None, batch_id=txn.batch_id if txn else None,
                fix=f"create it (kafka-topics.sh --create --topic {topic} ...) or fix "
                "KafkaSink(topic=...) / the topic column; nothing of this batch was "
                "committed",
            )
        _known_topics.add((config.bootstrap_servers, topic))


def row_topics(records: pa.RecordBatch) -> set[str]:
    """The per-row topics of serialised records (none without a topic column)."""
    if "topic" not in records.schema.names:
        return set()
    import pyarrow.compute as pc

    return {t for t in pc.unique(records.column("topic")).to_pylist() if t}


def check_publish_budget(config: KafkaConfig, batch_id: int,
                         receipts: Sequence[Receipt]) -> None:
    """A participant's publish is one Kafka transaction: one that cannot end within
    ``transaction.timeout.ms`` is aborted by the broker on every retry, and a decided
    batch would never be committed. Refuse it before the decision."""
    budget_s = PUBLISH_BUDGET * config.transaction_timeout_ms / 1000
    largest = max((int(r.get("bytes") or 0) for r in receipts), default=0)
    if largest / config.min_publish_bytes_per_s <= budget_s:
        return
    raise ConfigurationError(
        f"batch {batch_id}: one participant staged {largest / 1e6:.1f} MB; published "
        f"at {config.min_publish_bytes_per_s / 1e6:.1f} MB/s (min_publish_bytes_per_s) it "
        f"would outlast transaction.timeout.ms ({config.transaction_timeout_ms} ms) and "
        "the broker would abort it on every retry",
        batch_id=batch_id,
        fix="raise KafkaSink(transaction_timeout_ms=...) (up to the brokers' "
        "transaction.max.timeout.ms), spread the batch over more writers "
        "(exactly_once(..., writers=N)), or bound the batch (maxOffsetsPerTrigger, "
        "maxFilesPerTrigger); nothing of this batch was sent")


def split_by_budget(config: KafkaConfig, receipts: Sequence[Receipt],
                    groups: Sequence[int]) -> list[int]:
    """``groups`` (a committer per receipt, contiguous runs), with a run cut where the
    bytes staged since its start would outlast the publish budget of one Kafka
    transaction (as ``check_publish_budget`` checks one participant): a merged commit
    must end within ``transaction.timeout.ms`` like any other. Renumbered from 0."""
    budget = PUBLISH_BUDGET * config.transaction_timeout_ms / 1000 * (
        config.min_publish_bytes_per_s)
    out: list[int] = []
    previous, used = None, 0.0
    for receipt, group in zip(receipts, groups, strict=True):
        size = float(receipt.get("bytes") or 0)
        if group != previous or (used and used + size > budget):
            out.append(out[-1] + 1 if out else 0)
            previous, used = group, size
        else:
            out.append(out[-1])
            used += size
    return out


def _check_transaction_timeout(config: KafkaConfig, broker_config: dict[str, str]) -> None:
    limit = broker_config.get(BROKER_MAX_TXN_TIMEOUT)
    if limit is not None and config.transaction_timeout_ms > int(limit):
        raise ConfigurationError(
            f"transaction_timeout_ms={config.transaction_timeout_ms} is larger than the "
            f"broker's {BROKER_MAX_TXN_TIMEOUT}={limit}: every transaction would be "
            "refused (INVALID_TRANSACTION_TIMEOUT)",
            fix=f"use KafkaSink(transaction_timeout_ms=<= {limit}) or raise "
            f"{BROKER_MAX_TXN_TIMEOUT} on the brokers; nothing was written",
        )


def _broker_config(config: KafkaConfig, admin: Any, metadata: Any) -> dict[str, str]:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    if not metadata.brokers:
        return {}
    broker_id = str(sorted(metadata.brokers)[0])
    try:
        futures = admin.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)],
                                         request_timeout=config.timeout_s)
        entries = next(iter(futures.values())).result(timeout=config.timeout_s)
    except Exception:
        # Not allowed to describe configs (ACLs): init_transactions reports a bad
        # timeout as INVALID_TRANSACTION_TIMEOUT (a ConfigurationError) instead.
        return {}
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def _create_marker_topic(config: KafkaConfig, admin: Any, brokers: int) -> None:
    _create_topic(
        config, admin, brokers, config.marker_topic, dict(MARKER_TOPIC_CONFIG),
        what=f"the marker topic {config.marker_topic!r}",
        fix=f"create it once with 1 partition, compacted (kafka-topics.sh --create "
        f"--topic {config.marker_topic} --partitions 1 --config cleanup.policy=compact), "
        "or grant CREATE on it; never delete it while queries use it (the broker "
        "drops the markers of deleted topics)")


def _create_announce_topic(config: KafkaConfig, admin: Any, brokers: int) -> None:
    _create_topic(
        config, admin, brokers, config.announce_topic, {},
        what=f"the announcement topic {config.announce_topic!r} (where at-least-once "
        "transactions announce themselves)",
        fix=f"create it once with 1 partition (kafka-topics.sh --create --topic "
        f"{config.announce_topic} --partitions 1), or grant CREATE on it; nothing "
        "was written")


def _create_topic(config: KafkaConfig, admin: Any, brokers: int, name: str,
                  settings: dict[str, str], what: str, fix: str) -> None:
    """One partition, replicated up to 3 times; a topic another process just made is
    fine."""
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    topic = NewTopic(name, num_partitions=1, replication_factor=max(1, min(3, brokers)),
                     config=settings)
    try:
        admin.create_topics([topic], request_timeout=config.timeout_s)[name].result(
            timeout=config.timeout_s)
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" in str(exc):
            return
        raise ConfigurationError(
            f"{what} does not exist and could not be created on {config.bootstrap} "
            f"({short(exc)})", fix=fix) from None


def _check_marker_topic(config: KafkaConfig, admin: Any) -> None:
    """The progress records must never expire: the marker topic is compacted only."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    try:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, config.marker_topic)],
            request_timeout=config.timeout_s)
        entries = next(iter(futures.values())).result(timeout=config.timeout_s)
    except Exception:
        return  # no DescribeConfigs ACL: the topic is taken as created by this sink
    policy = str(getattr(entries.get("cleanup.policy"), "value", "compact"))
    if policy.replace(" ", "") != "compact":
        raise ConfigurationError(
            f"the marker topic {config.marker_topic!r} has cleanup.policy={policy}: its "
            "progress records would be deleted after retention.ms, and a query stopped "
            "longer than that could publish a committed batch again",
            fix=f"kafka-configs.sh --alter --entity-type topics --entity-name "
            f"{config.marker_topic} --add-config cleanup.policy=compact (or use another "
            "marker_topic); nothing was written",
        )
