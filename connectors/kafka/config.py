"""KafkaSink's validated configuration: the fields, their checks, and the secrets.

``KafkaConfig`` holds every setting of a ``KafkaSink`` (the sink is this dataclass plus
the protocol), refuses bad values when the sink is built, and derives what the other
rooms need from them: the librdkafka settings of the clients, the record layout, the
transactional IDs. ``public_producer_config`` / ``check_recorded`` keep secret
``producer_config`` values out of the commit log and refuse to rebuild a sink from a
description that lost them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import Transaction
from sparkeos.core.storage.registry import resolve_location
from sparkeos.core.text.records import RecordLayout, check_format, check_payload_format

from . import clients

MODES = ("staged", "direct")
STAGING_ENV = "SPARKEOS_KAFKA_STAGING_DIR"
DEFAULT_MARKER_TOPIC = "sparkeos-markers"
ANNOUNCE_SUFFIX = "-open"
"""``<marker topic>-open``: where at-least-once transactions announce themselves."""
DEFAULT_MARKER_GROUP_PREFIX = "sparkeos-marker."
DIRECT_GUARANTEES = frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE})
_SECRET_KEY = re.compile(r"password|secret|credential|token|private|\.pem$|ssl_key|"
                         r"oauthbearer\.config|jaas", re.IGNORECASE)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


JAVA_PARTITIONER = "murmur2_random"
"""librdkafka's name for the Java client's partitioner of keyed records (murmur2 of the
key's bytes); records without a key go to a random partition."""


@dataclass(frozen=True)
class KafkaConfig:
    """The settings of a ``KafkaSink``, checked when it is built.

    Records: ``topic`` (fixed) or ``topic_column`` (per row; ``topic`` is then the
    default for nulls); ``key_column`` (optional); ``value_column`` (default: the whole
    row as a JSON object); ``headers_column`` (``array<struct<key,value>>`` or a map).
    ``key_format`` / ``value_format``: ``"bytes"``, ``"string"``, ``"json"`` or None
    (auto: bytes for binary/string columns, JSON otherwise); see ``serde``.

    ``producer_config``: librdkafka settings passed through unchanged (``linger.ms``,
    ``compression.type``, ``security.protocol``, ``sasl.*``, ``ssl.*``...). Keys that
    look secret (passwords, secrets, tokens, PEM keys) are never written to the commit
    log. ``bootstrap.servers``, ``transactional.id``, ``transaction.timeout.ms``,
    ``enable.idempotence`` and consumer keys are set by the sink (see the fields).

    ``staging_dir``: where staged mode keeps prepared batches: a path every executor
    reads and writes the same (a shared mount) or an HDFS URI (``hdfs://``,
    ``webhdfs://``). Default ``$SPARKEOS_KAFKA_STAGING_DIR``, else
    ``<checkpointLocation>/sparkeos-staging/<sink name>``: the query's checkpoint is
    shared by every driver restart and, on a cluster, by every executor. ``fsync``:
    make staged files durable before prepare returns (turn off only for throw-away
    data).

    ``transaction_timeout_ms``: ``transaction.timeout.ms`` of the producers; checked
    against the broker's ``transaction.max.timeout.ms`` before the first batch. A Kafka
    transaction lasts one participant's publish (staged) or one task (direct).

    ``transactional_id_prefix`` / ``marker_group_prefix``: prefixes for ACLs (the
    transactional ID is ``<prefix>seos-<query>-<sink>-p<partition>-s<slot>``).
    ``timeout_s``: bound on every broker operation (connect, init, commit, marker read).
    ``min_publish_bytes_per_s``: the slowest rate a phase-2 publish is assumed to reach;
    a batch whose largest participant could not be published within
    ``transaction_timeout_ms`` at it is refused before its decision.
    """

    bootstrap_servers: str
    topic: str | None = None
    topic_column: str | None = None
    key_column: str | None = None
    value_column: str | None = None
    headers_column: str | None = None
    key_format: str | None = None
    value_format: str | None = None
    producer_config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """May hold passwords and keys: left out of ``repr`` (``describe()`` shows the rest)."""
    mode: str = "staged"
    staging_dir: str | None = None
    fsync: bool = True
    transaction_timeout_ms: int = 60_000
    transactional_id_prefix: str = ""
    marker_topic: str = DEFAULT_MARKER_TOPIC
    marker_group_prefix: str = DEFAULT_MARKER_GROUP_PREFIX
    timeout_s: float = 30.0
    min_publish_bytes_per_s: float = 1_000_000.0

    def __post_init__(self) -> None:
        _check_destination(self)
        _check_producer_config(self.producer_config)
        object.__setattr__(self, "producer_config", dict(self.producer_config))
        _check_limits(self)
        if self.mode == "staged":
            staging = self.staging_dir or os.environ.get(STAGING_ENV)
            if staging:
                object.__setattr__(self, "staging_dir", resolve_location(staging))
        else:
            # Direct mode commits in phase 1: the coordinator's exactly-once contract
            # (nothing visible before the decision) cannot hold.
            object.__setattr__(self, "guarantees", DIRECT_GUARANTEES)

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers, normalised (what error messages name)."""
        return ",".join(sorted(s.strip() for s in self.bootstrap_servers.split(",") if s.strip()))

    def layout(self) -> RecordLayout:
        return RecordLayout(self.topic, self.topic_column, self.key_column, self.value_column,
                            self.headers_column, self.key_format, self.value_format)

    def client_config(self) -> dict[str, Any]:
        """The librdkafka configuration shared by every client (no transactional.id)."""
        return {**self.producer_config, "bootstrap.servers": self.bootstrap_servers}

    def producer_settings(self, transactional_id: str) -> dict[str, Any]:
        # A keyed record goes to the partition the Java client (so Spark's kafka sink,
        # Kafka Streams, Connect) picks for that key: murmur2, not librdkafka's default
        # CRC32. A ``partitioner`` in producer_config overrides it.
        return {"partitioner": JAVA_PARTITIONER, **self.client_config(),
                "transactional.id": transactional_id,
                "transaction.timeout.ms": self.transaction_timeout_ms,
                "enable.idempotence": True}

    @property
    def announces_open(self) -> bool:
        """Whether each transaction first announces itself on ``announce_topic``, so the
        next run finds it there if its writer dies with it open (``pool``): under
        at-least-once, where nobody commits a dead run's participants again (direct mode
        always; a staged sink once ``for_guarantee`` chose at-least-once). Exactly-once
        recovery commits every decided participant again, which closes its ID."""
        return self.mode == "direct" or bool(self.__dict__.get("_announce_open"))

    @property
    def announce_topic(self) -> str:
        """Where at-least-once transactions announce themselves: beside the marker topic,
        never on it. A transaction its writer left open pins the last stable offset of
        every partition it wrote until it is closed; on the marker topic that would hide
        every other query's progress records from the ``read_committed`` reads of their
        recoveries. Only ``pool`` reads this topic, from that offset on, with
        ``read_uncommitted``."""
        return self.marker_topic + ANNOUNCE_SUFFIX

    def transactional_id(self, txn: Transaction) -> str:
        """The participant's pooled ID: two per participant, shared by its attempts."""
        return f"{self.transactional_id_prefix}{txn.participant_id}"


def _check_destination(config: KafkaConfig) -> None:
    """Where the records go and how they are encoded."""
    if not isinstance(config.bootstrap_servers, str) or not config.bootstrap_servers.strip():
        raise ConfigurationError(
            "KafkaSink needs bootstrap_servers",
            fix="KafkaSink(bootstrap_servers='broker1:9092,broker2:9092', topic='out')",
        )
    if config.topic is None and config.topic_column is None:
        raise ConfigurationError(
            "KafkaSink needs a topic or a topic_column",
            fix="KafkaSink(..., topic='out') or KafkaSink(..., topic_column='topic')",
        )
    if config.mode not in MODES:
        raise ConfigurationError(
            f"unknown KafkaSink mode {config.mode!r}",
            fix="use mode='staged' (exactly-once, default) or mode='direct' "
            "(faster, at-least-once with replay deduplication)",
        )
    check_format("key_format", config.key_format)
    check_payload_format("value", config.value_column, config.value_format)


def _check_producer_config(producer_config: Any) -> None:
    if not isinstance(producer_config, Mapping):
        raise ConfigurationError("producer_config must be a dict of librdkafka settings")
    owned = sorted(set(producer_config) & clients.OWNED_KEYS)
    if owned:
        raise ConfigurationError(
            f"producer_config sets {', '.join(owned)}, which KafkaSink manages",
            fix="use KafkaSink(bootstrap_servers=..., transaction_timeout_ms=..., "
            "transactional_id_prefix=...) instead; transactions (and so idempotence) "
            "are always on",
        )


def _check_limits(config: KafkaConfig) -> None:
    """Timeouts, the assumed publish rate and the marker topic's name."""
    if (not isinstance(config.transaction_timeout_ms, int)
            or config.transaction_timeout_ms < 1000):
        raise ConfigurationError(
            f"transaction_timeout_ms={config.transaction_timeout_ms!r} is too small",
            fix="use at least 1000 ms (librdkafka default 60000)",
        )
    if config.timeout_s <= 0:
        raise ConfigurationError(f"timeout_s={config.timeout_s!r} must be > 0")
    if not config.min_publish_bytes_per_s > 0:
        raise ConfigurationError(
            f"min_publish_bytes_per_s={config.min_publish_bytes_per_s!r} must be > 0")
    if not config.marker_topic or _UNSAFE.search(config.marker_topic):
        raise ConfigurationError(
            f"invalid marker_topic {config.marker_topic!r}",
            fix="use letters, digits, '.', '_' and '-'",
        )


def public_producer_config(out: dict[str, Any], producer_config: Mapping[str, Any]) -> None:
    """Put ``producer_config`` into a description without its secret-looking keys (and
    values that are not plain scalars, e.g. callbacks); list the omitted keys."""
    public: dict[str, Any] = {}
    omitted: list[str] = []
    for key, value in producer_config.items():
        if _SECRET_KEY.search(key) or not isinstance(value, (str, int, float, bool)):
            omitted.append(key)
        else:
            public[key] = value
    out["producer_config"] = public
    if omitted:
        out["producer_config_omitted"] = sorted(omitted)


def check_recorded(description: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a recorded description, refused if it lost secret settings (a
    sink rebuilt without them would fail to authenticate, or write elsewhere)."""
    settings = dict(description)
    omitted = settings.pop("producer_config_omitted", None)
    if omitted:
        raise ConfigurationError(
            f"the recorded KafkaSink omits secret producer settings ({', '.join(omitted)})",
            fix="rebuild the sink in your code with its full producer_config and restart "
            "the query; it finishes any pending commits first",
        )
    return settings
