"""Exactly-once Kafka sink (confluent-kafka / librdkafka).

librdkafka cannot resume a prepared Kafka transaction in another process (no KIP-939),
so a Kafka transaction cannot be "prepared" in phase 1 and committed by the driver in
phase 2. The two modes deal with that differently.

``mode="staged"`` (default; exactly-once, ``commit_location = TASKS``)
    Phase 1 (task attempt): serialise the partition's records (key/value/topic/headers
    bytes) into an Arrow IPC file ``<staging_dir>/<prefix><attempt txn id>/
    records.arrow`` (a directory each attempt creates exclusively) and fsync it. The
    receipt names the file. Nothing is sent to Kafka.

    Phase 2 (a Spark task per participant, after ``decided(N)``): a fresh transactional
    producer with ``transactional.id`` = the pool's participant ID for (query, sink,
    partition, slot) calls ``init_transactions()`` (fences every earlier producer of
    that ID, including a concurrent attempt of the same commit, and aborts what it left
    open), then reads the participant's MARKER; if it says batch N is committed,
    nothing is sent (commit is idempotent). Otherwise it begins a Kafka transaction,
    produces every staged record of the decided attempt, adds the marker to the same
    transaction and commits; then that attempt's staged file is deleted. The
    coordinator's sweep deletes what the other attempts staged.

    The MARKER is a consumer-group offset committed inside the Kafka transaction
    (``send_offsets_to_transaction``, KIP-98/447): group
    ``<marker_group_prefix><query>.<sink>.<destination hash>.p<partition>``, topic
    ``marker_topic`` (1 partition, created on first use), offset ``N + 1``. The broker
    makes the offset visible atomically with the records, only if the transaction
    commits; a reader with ``require_stable`` (librdkafka's ``committed()`` under
    ``read_committed``) never sees a pending one. "Batch N of participant p is
    committed" is then ``committed offset >= N + 1`` (batches of a query commit in
    order). The same transaction writes a PROGRESS record to ``marker_topic`` (key:
    the group name, value: ``{"batch": N}``); the topic is compacted, so the last
    record of every participant is kept for ever (see "Marker retention").

``mode="direct"`` (opt-in, faster; at-least-once with replay deduplication)
    Each task opens the Kafka transaction itself in phase 1, produces its partition,
    adds its marker and commits right away: no staging, no second Spark job. The
    records are visible before the batch is decided, so the coordinator's
    exactly-once contract (invariant 1) cannot hold and the sink offers only
    ``at_least_once`` / ``none``: use ``at_least_once(sink, name=...)``. A re-run of
    batch N skips every (batch, partition) whose marker is already committed, so the
    output is exactly-once **if and only if a re-run of batch N gives every partition
    the same rows** (deterministic input partitioning, e.g. a replayable source and no
    non-deterministic repartition). Otherwise rows may be missing or duplicated.

Zombies: a commit attempt still running after a newer one started is fenced by the
newer ``init_transactions`` (epoch bump); its commit fails and its records are
aborted. Staged files of a zombie task attempt are never named by ``decided(N)`` and
are deleted by the coordinator's sweeps.

Marker retention: consumer-group offsets of an idle group are removed by the broker
after ``offsets.retention.minutes`` (default 7 days). Every commit refreshes them, so a
running query is unaffected, and within a run a commit follows its decision at once.
After a restart, when a marker offset is absent (expired while the query was down, or
never written), the recovering commit reads the progress records instead (a scan of
the compacted marker topic with ``read_committed``), so exactly-once does not depend
on the outage being short.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import (
    ConfigurationError,
    DataLossError,
    RetriableError,
    SparkEOSError,
)
from sparkeos.core.files import resolve_location
from sparkeos.core.protocol import (
    CommitLocation,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.records import RecordLayout, check_format, iter_records
from sparkeos.core.staging import StagingArea, default_dir
from sparkeos.core.steps import commit_step
from sparkeos.core.txpool import AttemptRange

from . import clients
from .errors import (
    DRIVER,
    PHASE1,
    PHASE2,
    is_fenced,
    is_retriable,
    requires_abort,
    translate,
    underlying,
)

MODES = ("staged", "direct")
STAGED_FILE = "records.arrow"
STAGING_ENV = "SPARKEOS_KAFKA_STAGING_DIR"
CHECKPOINT_STAGING = "sparkeos-staging"
"""The default staging directory: ``<checkpointLocation>/sparkeos-staging/<sink name>``."""
DEFAULT_MARKER_TOPIC = "sparkeos-markers"
DEFAULT_MARKER_GROUP_PREFIX = "sparkeos-marker."
MARKER_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
BROKER_MAX_TXN_TIMEOUT = "transaction.max.timeout.ms"
_SECRET_KEY = re.compile(r"password|secret|credential|token|private|\.pem$|ssl_key|"
                         r"oauthbearer\.config|jaas", re.IGNORECASE)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_OFFSET_INVALID = -1001
PUBLISH_BUDGET = 0.8
"""The share of transaction.timeout.ms a participant's publish may take at the slowest
rate the sink assumes (the rest is for connecting, the marker and the commit)."""
_validated: set[str] = set()
_validated_lock = threading.Lock()
_known_topics: set[tuple[str, str]] = set()
"""(cluster, topic) seen to exist in this process (per-row topics are checked once
each; two clusters may both have a topic of one name, or only one of them)."""

T = TypeVar("T")


def default_staging_dir() -> str:
    """Where a sink not bound to a checkpoint stages (runners without Spark):
    ``$SPARKEOS_KAFKA_STAGING_DIR``, else ``~/.sparkeos/kafka-staging``."""
    return default_dir(STAGING_ENV, "kafka-staging")


@dataclass
class _Handle:
    txn: Transaction
    rows: int = 0
    directory: str | None = None
    local_file: str | None = None
    """Where the staged file is written on this host (in ``directory`` on a POSIX
    staging_dir; a temporary file uploaded at prepare on HDFS)."""
    file: Any = None
    writer: Any = None
    producer: Any = None
    skipped: bool = False
    bytes: int = 0
    topics: set[str] = field(default_factory=set)
    """Per-row topics the attempt wrote (checked before it prepares)."""


@dataclass(frozen=True)
class KafkaSink(TransactionalSink[_Handle]):
    """Write a foreachBatch DataFrame to Kafka, exactly once (``mode="staged"``).

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

    commit_location: ClassVar[CommitLocation] = CommitLocation.TASKS
    commit_steps: ClassVar[tuple[str, ...]] = ("initialised", "checked", "produced",
                                               "committed")

    def __post_init__(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise ConfigurationError(
                "KafkaSink needs bootstrap_servers",
                fix="KafkaSink(bootstrap_servers='broker1:9092,broker2:9092', topic='out')",
            )
        if self.topic is None and self.topic_column is None:
            raise ConfigurationError(
                "KafkaSink needs a topic or a topic_column",
                fix="KafkaSink(..., topic='out') or KafkaSink(..., topic_column='topic')",
            )
        if self.mode not in MODES:
            raise ConfigurationError(
                f"unknown KafkaSink mode {self.mode!r}",
                fix="use mode='staged' (exactly-once, default) or mode='direct' "
                "(faster, at-least-once with replay deduplication)",
            )
        check_format("key_format", self.key_format)
        check_format("value_format", self.value_format)
        if self.value_column is None and self.value_format not in (None, "json"):
            raise ConfigurationError(
                f"value_format={self.value_format!r} needs a value_column; without one the "
                "value is the whole row as JSON",
                fix="set value_column='<column>' or drop value_format",
            )
        if not isinstance(self.producer_config, Mapping):
            raise ConfigurationError("producer_config must be a dict of librdkafka settings")
        owned = sorted(set(self.producer_config) & clients.OWNED_KEYS)
        if owned:
            raise ConfigurationError(
                f"producer_config sets {', '.join(owned)}, which KafkaSink manages",
                fix="use KafkaSink(bootstrap_servers=..., transaction_timeout_ms=..., "
                "transactional_id_prefix=...) instead; transactions (and so idempotence) "
                "are always on",
            )
        object.__setattr__(self, "producer_config", dict(self.producer_config))
        if (not isinstance(self.transaction_timeout_ms, int)
                or self.transaction_timeout_ms < 1000):
            raise ConfigurationError(
                f"transaction_timeout_ms={self.transaction_timeout_ms!r} is too small",
                fix="use at least 1000 ms (librdkafka default 60000)",
            )
        if self.timeout_s <= 0:
            raise ConfigurationError(f"timeout_s={self.timeout_s!r} must be > 0")
        if not self.min_publish_bytes_per_s > 0:
            raise ConfigurationError(
                f"min_publish_bytes_per_s={self.min_publish_bytes_per_s!r} must be > 0")
        if not self.marker_topic or _UNSAFE.search(self.marker_topic):
            raise ConfigurationError(
                f"invalid marker_topic {self.marker_topic!r}",
                fix="use letters, digits, '.', '_' and '-'",
            )
        if self.mode == "staged":
            staging = self.staging_dir or os.environ.get(STAGING_ENV)
            if staging:
                object.__setattr__(self, "staging_dir", resolve_location(staging))
        else:
            # Direct mode commits in phase 1: the coordinator's exactly-once contract
            # (nothing visible before the decision) cannot hold.
            object.__setattr__(self, "guarantees",
                               frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE}))

    def __hash__(self) -> int:
        return hash(json.dumps(self.describe(), sort_keys=True, default=str))

    # -- identity / description ------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        """The bootstrap servers, normalised (what error messages name)."""
        return ",".join(sorted(s.strip() for s in self.bootstrap_servers.split(",") if s.strip()))

    def identity(self) -> dict[str, Any]:
        """Where the output and its markers go. Not the bootstrap list: adding a broker to
        it is routine and must not look like another destination to the commit log."""
        return {"topic": self.topic, "topic_column": self.topic_column,
                "marker_topic": self.marker_topic,
                "marker_group_prefix": self.marker_group_prefix,
                "transactional_id_prefix": self.transactional_id_prefix}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        public: dict[str, Any] = {}
        omitted: list[str] = []
        for key, value in self.producer_config.items():
            if _SECRET_KEY.search(key) or not isinstance(value, (str, int, float, bool)):
                omitted.append(key)
            else:
                public[key] = value
        out["producer_config"] = public
        if omitted:
            out["producer_config_omitted"] = sorted(omitted)
        return out

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> KafkaSink:
        settings = dict(description)
        omitted = settings.pop("producer_config_omitted", None)
        if omitted:
            raise ConfigurationError(
                f"the recorded KafkaSink omits secret producer settings ({', '.join(omitted)})",
                fix="rebuild the sink in your code with its full producer_config and restart "
                "the query; it finishes any pending commits first",
            )
        return cls(**settings)

    def transactional_id(self, txn: Transaction) -> str:
        """The participant's pooled ID: two per participant, shared by its attempts."""
        return f"{self.transactional_id_prefix}{txn.participant_id}"

    def marker_group(self, txn: Transaction) -> str:
        return f"{self._marker_stem(txn.query_key, txn.sink)}.p{txn.partition}"

    def _marker_stem(self, query_key: str, sink: str) -> str:
        digest = hashlib.sha256(
            json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.marker_group_prefix}{query_key}.{sink}.{digest}"

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        """Progress records of this sink name and destination from other query keys."""
        mine = self._marker_stem(query_key, sink)
        pattern = re.compile(re.escape(self.marker_group_prefix) + r"([^.]+)\."
                             + re.escape(f"{sink}.{mine.rsplit('.', 1)[1]}") + r"\.p\d+$")
        try:
            records = read_topic(self.bootstrap_servers, self.marker_topic,
                                 timeout_s=self.timeout_s, config=self.producer_config,
                                 open_transactions="fail")
        except Exception as exc:
            # Fail closed: "no other output" must be known, never assumed; the check
            # runs again on the next batch.
            raise RetriableError(
                f"could not read the progress records in {self.marker_topic} on "
                f"{self.bootstrap}, which tell whether another query (a lost checkpoint) "
                f"already wrote sink {sink!r}: {_short(exc)}",
                sink=sink,
                fix="make the marker topic readable (the broker up, the consumer allowed "
                "to read it, no transaction left open on it for longer than "
                "transaction.timeout.ms) and restart the query; or pass "
                "exactly_once(..., existing_output='accept') if you know there is none; "
                "nothing was written",
            ) from None
        others: dict[str, int] = {}
        for record in records:
            match = pattern.match((record.key() or b"").decode(errors="replace"))
            if match and match.group(1) != query_key:
                batch = int(json.loads(record.value())["batch"])
                others[match.group(1)] = max(others.get(match.group(1), -1), batch)
        if not others:
            return None
        return f"progress records in {self.marker_topic} of query keys " + ", ".join(
            f"{key} (batches up to {last})" for key, last in sorted(others.items()))

    def layout(self) -> RecordLayout:
        return RecordLayout(self.topic, self.topic_column, self.key_column, self.value_column,
                            self.headers_column, self.key_format, self.value_format)

    def client_config(self) -> dict[str, Any]:
        """The librdkafka configuration shared by every client (no transactional.id)."""
        return {**self.producer_config, "bootstrap.servers": self.bootstrap_servers}

    def producer_settings(self, transactional_id: str) -> dict[str, Any]:
        return {**self.client_config(), "transactional.id": transactional_id,
                "transaction.timeout.ms": self.transaction_timeout_ms,
                "enable.idempotence": True}

    # -- driver ------------------------------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        self.layout().check_schema(schema)
        if self.mode == "staged":
            self._check_staging_dir()
        key = clients.fingerprint({**self.client_config(), "#marker": self.marker_topic,
                                   "#topic": self.topic, "#ttms": self.transaction_timeout_ms})
        with _validated_lock:
            if key in _validated:
                return
        self.check_broker()
        with _validated_lock:
            _validated.add(key)

    def check_broker(self) -> None:
        """Reachability, ``transaction.timeout.ms`` limit, marker and output topics."""
        try:
            # A client that is closed right away: one left behind would go on trying to
            # reach an unreachable broker (and logging it) for the rest of the process.
            clients.probe_brokers(self.client_config(), self.timeout_s)
            admin = clients.admin_client(self.client_config())
            metadata = admin.list_topics(timeout=self.timeout_s)
        except Exception as exc:
            clients.drop_admin(self.client_config())
            raise RetriableError(
                f"the Kafka brokers at {self.bootstrap} did not answer within "
                f"{self.timeout_s:g} s ({_short(exc)})",
                fix="start the brokers or fix bootstrap_servers / the security settings in "
                "producer_config; nothing of this batch was written",
            ) from None
        broker_config = self._broker_config(admin, metadata)
        limit = broker_config.get(BROKER_MAX_TXN_TIMEOUT)
        if limit is not None and self.transaction_timeout_ms > int(limit):
            raise ConfigurationError(
                f"transaction_timeout_ms={self.transaction_timeout_ms} is larger than the "
                f"broker's {BROKER_MAX_TXN_TIMEOUT}={limit}: every transaction would be "
                "refused (INVALID_TRANSACTION_TIMEOUT)",
                fix=f"use KafkaSink(transaction_timeout_ms=<= {limit}) or raise "
                f"{BROKER_MAX_TXN_TIMEOUT} on the brokers; nothing was written",
            )
        if self.marker_topic not in metadata.topics:
            self._create_marker_topic(admin, len(metadata.brokers))
        else:
            self._check_marker_topic(admin)
        if self.topic is not None and self.topic not in metadata.topics:
            self.require_topics([self.topic])

    def require_topics(self, topics: Sequence[str], txn: Transaction | None = None) -> None:
        """Every topic exists, or the brokers create it on first use; else a
        ``ConfigurationError`` naming it, before the batch is decided (a commit to a
        missing topic would time out after the decision, the batch stuck until the
        topic appears)."""
        for topic in topics:
            if (self.bootstrap_servers, topic) in _known_topics:
                continue
            if not clients.topic_available(self.client_config(), topic, self.timeout_s):
                raise ConfigurationError(
                    f"topic {topic!r} does not exist on {self.bootstrap} and the brokers do "
                    "not create topics automatically",
                    sink=txn.sink if txn else None, batch_id=txn.batch_id if txn else None,
                    fix=f"create it (kafka-topics.sh --create --topic {topic} ...) or fix "
                    "KafkaSink(topic=...) / the topic column; nothing of this batch was "
                    "committed",
                )
            _known_topics.add((self.bootstrap_servers, topic))

    def _broker_config(self, admin: Any, metadata: Any) -> dict[str, str]:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ConfigResource,
            ResourceType,
        )

        if not metadata.brokers:
            return {}
        broker_id = str(sorted(metadata.brokers)[0])
        try:
            futures = admin.describe_configs([ConfigResource(ResourceType.BROKER, broker_id)],
                                             request_timeout=self.timeout_s)
            entries = next(iter(futures.values())).result(timeout=self.timeout_s)
        except Exception:
            # Not allowed to describe configs (ACLs): init_transactions reports a bad
            # timeout as INVALID_TRANSACTION_TIMEOUT (a ConfigurationError) instead.
            return {}
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def _create_marker_topic(self, admin: Any, brokers: int) -> None:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        topic = NewTopic(self.marker_topic, num_partitions=1,
                         replication_factor=max(1, min(3, brokers)),
                         config=dict(MARKER_TOPIC_CONFIG))
        try:
            admin.create_topics([topic], request_timeout=self.timeout_s)[
                self.marker_topic].result(timeout=self.timeout_s)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc):
                return
            raise ConfigurationError(
                f"the marker topic {self.marker_topic!r} does not exist and could not be "
                f"created on {self.bootstrap} ({_short(exc)})",
                fix=f"create it once with 1 partition, compacted (kafka-topics.sh --create "
                f"--topic {self.marker_topic} --partitions 1 --config cleanup.policy=compact), "
                "or grant CREATE on it; never delete it while queries use it (the broker "
                "drops the markers of deleted topics)",
            ) from None

    def _check_marker_topic(self, admin: Any) -> None:
        """The progress records must never expire: the marker topic is compacted only."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ConfigResource,
            ResourceType,
        )

        try:
            futures = admin.describe_configs(
                [ConfigResource(ResourceType.TOPIC, self.marker_topic)],
                request_timeout=self.timeout_s)
            entries = next(iter(futures.values())).result(timeout=self.timeout_s)
        except Exception:
            return  # no DescribeConfigs ACL: the topic is taken as created by this sink
        policy = str(getattr(entries.get("cleanup.policy"), "value", "compact"))
        if policy.replace(" ", "") != "compact":
            raise ConfigurationError(
                f"the marker topic {self.marker_topic!r} has cleanup.policy={policy}: its "
                "progress records would be deleted after retention.ms, and a query stopped "
                "longer than that could publish a committed batch again",
                fix=f"kafka-configs.sh --alter --entity-type topics --entity-name "
                f"{self.marker_topic} --add-config cleanup.policy=compact (or use another "
                "marker_topic); nothing was written",
            )

    def _check_staging_dir(self) -> None:
        self.__dict__["_mark"] = self.staging.check_on_driver(self.__dict__.get("_mark"))

    # -- phase 1 (tasks) ---------------------------------------------------------------------
    def begin(self, txn: Transaction) -> _Handle:
        if self.mode == "staged":
            return _Handle(txn, directory=self.staging.claim(txn, self.__dict__.get("_mark")))
        handle = _Handle(txn)
        producer = self._init_producer(txn, PHASE1)
        try:
            if self._committed_batch(txn, PHASE1) >= txn.batch_id:
                handle.skipped = True  # a re-run of a committed (batch, partition)
                clients.close_quietly(producer)
                return handle
            producer.begin_transaction()
        except BaseException as exc:
            clients.close_quietly(producer)
            raise self._error(exc, txn, PHASE1, "begin transaction") from None
        handle.producer = producer
        return handle

    def write(self, handle: _Handle, batch: pa.RecordBatch) -> None:
        handle.rows += batch.num_rows
        if handle.skipped:
            return
        records = self.layout().serialize(batch)
        if "topic" in records.schema.names:
            import pyarrow.compute as pc

            topics = {t for t in pc.unique(records.column("topic")).to_pylist() if t}
            if handle.directory is None:  # direct mode produces right away: check first
                self.require_topics(sorted(topics - handle.topics), handle.txn)
            handle.topics.update(topics)
        if handle.directory is not None:
            if handle.writer is None:
                handle.local_file = self.staging.writable_file(handle.directory, STAGED_FILE)
                handle.file = pa.OSFile(handle.local_file, "wb")
                handle.writer = pa.ipc.new_file(handle.file, records.schema)
            handle.writer.write_batch(records)
            return
        try:
            self._produce(handle.producer, records, handle.txn)
        except BaseException as exc:
            raise self._error(underlying(handle.producer, exc), handle.txn, PHASE1,
                              "produce") from None

    def before_decision(self, batch_id: int, receipts: Sequence[Receipt]) -> None:
        """A participant's publish is one Kafka transaction: one that cannot end within
        ``transaction.timeout.ms`` is aborted by the broker on every retry, and a decided
        batch would never be committed. Refuse it before the decision."""
        if self.mode != "staged":
            return
        budget_s = PUBLISH_BUDGET * self.transaction_timeout_ms / 1000
        largest = max((int(r.get("bytes") or 0) for r in receipts), default=0)
        if largest / self.min_publish_bytes_per_s <= budget_s:
            return
        raise ConfigurationError(
            f"batch {batch_id}: one participant staged {largest / 1e6:.1f} MB; published "
            f"at {self.min_publish_bytes_per_s / 1e6:.1f} MB/s (min_publish_bytes_per_s) it "
            f"would outlast transaction.timeout.ms ({self.transaction_timeout_ms} ms) and "
            "the broker would abort it on every retry",
            batch_id=batch_id,
            fix="raise KafkaSink(transaction_timeout_ms=...) (up to the brokers' "
            "transaction.max.timeout.ms), spread the batch over more writers "
            "(exactly_once(..., writers=N)), or bound the batch (maxOffsetsPerTrigger, "
            "maxFilesPerTrigger); nothing of this batch was sent")

    def prepare(self, handle: _Handle) -> Receipt:
        txn = handle.txn
        self.require_topics(sorted(handle.topics), txn)
        if handle.directory is not None:
            if handle.writer is None or handle.local_file is None:
                self.staging.discard(handle.directory, None)
                return {"mode": "staged", "file": None, "rows": 0}
            handle.writer.close()
            handle.file.close()
            size = os.path.getsize(handle.local_file)
            relative = self.staging.seal(handle.directory, STAGED_FILE, handle.local_file,
                                         self.fsync)
            return {"mode": "staged", "rows": handle.rows, "bytes": size,
                    "file": relative, "host": socket.gethostname()}
        if handle.skipped:
            return {"mode": "direct", "rows": handle.rows, "skipped": True}
        producer, handle.producer = handle.producer, None
        try:
            self._commit_with_marker(producer, txn)
        except BaseException as exc:
            exc = underlying(producer, exc)
            _abort_quietly(producer, self.timeout_s)
            raise self._error(exc, txn, PHASE1, "commit transaction") from None
        finally:
            clients.close_quietly(producer)
        return {"mode": "direct", "rows": handle.rows, "skipped": False}

    def abort(self, handle: _Handle, txn: Transaction) -> None:
        if handle.writer is not None:
            for closable in (handle.writer, handle.file):
                try:
                    closable.close()
                except Exception:
                    pass
        if handle.directory is not None:
            self.staging.discard(handle.directory, handle.local_file)
        if handle.producer is not None:
            producer, handle.producer = handle.producer, None
            _abort_quietly(producer, self.timeout_s)
            clients.close_quietly(producer)

    # -- phase 2 / recovery -------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        self._commit(txn, receipt, recovering=False)

    def recover_commit(self, txn: Transaction, receipt: Receipt) -> None:
        """After a restart, a marker offset may have expired while the query was down:
        then the progress record (which does not expire) says whether N is committed."""
        self._commit(txn, receipt, recovering=True)

    def _commit(self, txn: Transaction, receipt: Receipt, *, recovering: bool) -> None:
        if receipt.get("mode") == "direct":
            return  # committed by its task in phase 1
        if not receipt.get("file") or not receipt.get("rows"):
            self._delete_staged(txn)
            return
        deadline = time.monotonic() + max(self.timeout_s, self.transaction_timeout_ms / 1000)
        attempt = 0
        while True:
            attempt += 1
            try:
                self._publish(txn, receipt, recovering)
                break
            except SparkEOSError:
                raise
            except Exception as exc:
                # Leader moves, broker restarts, an abortable error: start over with a
                # fresh producer (its init_transactions aborts what is left open).
                transient = is_retriable(exc) or requires_abort(exc) or is_fenced(exc)
                if transient and attempt < 4 and time.monotonic() < deadline:
                    time.sleep(0.2 * attempt)
                    continue
                raise self._error(exc, txn, PHASE2, "commit") from None
        self._delete_staged(txn)

    def _publish(self, txn: Transaction, receipt: Receipt, recovering: bool) -> None:
        producer = self._init_producer(txn, PHASE2)
        try:
            commit_step("initialised", txn)
            if self._committed_batch(txn, PHASE2, recovering) >= txn.batch_id:
                return  # committed before (an earlier attempt or run): idempotent
            commit_step("checked", txn)
            path = self._staged_path(txn, receipt)
            if path is None:
                return
            producer.begin_transaction()
            try:
                with self.staging.open_staged(path) as source:
                    reader = pa.ipc.open_file(source)
                    for i in range(reader.num_record_batches):
                        self._produce(producer, reader.get_batch(i), txn)
            except FileNotFoundError:
                # Deleted while read (HDFS): by a twin that committed, or lost.
                if self._staged_path(txn, receipt) is None:
                    _abort_quietly(producer, self.timeout_s)
                    return
                raise
            commit_step("produced", txn)
            self._commit_with_marker(producer, txn)
            commit_step("committed", txn)
        except BaseException as exc:
            original = underlying(producer, exc)
            _abort_quietly(producer, self.timeout_s)
            if original is exc:
                raise
            raise original from None
        finally:
            clients.close_quietly(producer)

    def rollback(self, txn: Transaction) -> None:
        """Delete what the attempt staged. Nothing of an undecided attempt ever reached
        Kafka; a Kafka transaction a crashed commit left open under the participant's
        transactional.id is aborted by the next commit's init_transactions."""
        if self.mode == "staged":
            self._delete_staged(txn)

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        if self.mode == "staged":
            self.staging.sweep(ranges, keep)

    def probe(self, txn: Transaction) -> TxnState:
        if self.mode == "staged":
            if self.staging.has_file(txn, STAGED_FILE):
                return TxnState.PREPARED
            if self.staging.is_claimed(txn):
                return TxnState.OPEN
        if self._committed_batch(txn, DRIVER) >= txn.batch_id:
            return TxnState.COMMITTED
        return TxnState.ABSENT

    def close(self) -> None:
        clients.clear_caches()

    # -- Kafka helpers ----------------------------------------------------------------------------
    def _init_producer(self, txn: Transaction, phase: str) -> Any:
        tid = self.transactional_id(txn)
        try:
            producer = clients.new_producer(self.producer_settings(tid))
        except BaseException as exc:
            raise self._error(exc, txn, phase, "producer creation") from None
        try:
            # Connect first. librdkafka 2.16 drops the bootstrap connection once the
            # first metadata names the real broker; init_transactions that finds no
            # connection up waits for the 500 ms coordinator-query timer (measured: about
            # every other producer). Two metadata requests leave the real broker
            # connected: producer creation to initialised is then a steady ~57 ms.
            for _ in range(2):
                producer.list_topics(self.marker_topic, timeout=self.timeout_s)
            self._retrying(lambda: producer.init_transactions(self.timeout_s))
        except BaseException as exc:
            clients.close_quietly(producer)
            raise self._error(exc, txn, phase, "init_transactions") from None
        return producer

    def _committed_batch(self, txn: Transaction, phase: str, recovering: bool = False) -> int:
        """The last batch committed for ``txn``'s participant (-1 if none).

        The marker offset answers in one call. It is absent before the participant's
        first commit, and after the broker expired it (``offsets.retention.minutes``
        after the last commit, when a query stayed down that long). Within a run a
        commit follows its decision at once, so absent means "not committed"; a
        recovery asks the progress records, which never expire, instead."""
        from confluent_kafka import TopicPartition

        group = self.marker_group(txn)
        config = self.client_config()
        try:
            consumer = clients.marker_consumer(config, group)
            parts = consumer.committed([TopicPartition(self.marker_topic, 0)],
                                       timeout=self.timeout_s)
        except BaseException as exc:
            clients.drop_consumer(config, group)
            raise self._error(exc, txn, phase, f"marker read (group {group})") from None
        part = parts[0]
        if part.error is not None:
            raise self._error(RuntimeError(str(part.error)), txn, phase, "marker read")
        offset = int(part.offset)
        if offset >= 0:
            return offset - 1
        return self._progress_batch(txn, phase) if recovering else -1

    def _progress_batch(self, txn: Transaction, phase: str) -> int:
        """The batch of the participant's last committed progress record (-1 if none):
        a read of the compacted marker topic with ``read_committed``."""
        key = self.marker_group(txn).encode()
        try:
            records = read_topic(self.bootstrap_servers, self.marker_topic,
                                 timeout_s=self.timeout_s, config=self.producer_config,
                                 open_transactions="fail")
        except BaseException as exc:
            raise self._error(exc, txn, phase, "progress read") from None
        batches = [int(json.loads(r.value())["batch"]) for r in records if r.key() == key]
        return max(batches, default=-1)

    def _commit_with_marker(self, producer: Any, txn: Transaction) -> None:
        from confluent_kafka import TopicPartition

        group = self.marker_group(txn)
        consumer = clients.marker_consumer(self.client_config(), group)
        # The progress record: the marker that never expires (a compacted topic keeps
        # the last record per participant), in the same transaction as the records.
        producer.produce(self.marker_topic, json.dumps({"batch": txn.batch_id}).encode(),
                         group.encode(), partition=0)
        marker = [TopicPartition(self.marker_topic, 0, txn.batch_id + 1)]
        self._retrying(lambda: producer.send_offsets_to_transaction(
            marker, consumer.consumer_group_metadata(), self.timeout_s))
        self._retrying(lambda: producer.commit_transaction(self.timeout_s))

    def _retrying(self, call: Callable[[], T]) -> T:
        """Retry a transactional API call on retriable errors, within ``timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        delay = 0.05
        while True:
            try:
                return call()
            except Exception as exc:
                if (not is_retriable(exc) or requires_abort(exc)
                        or time.monotonic() + delay > deadline):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _produce(self, producer: Any, records: pa.RecordBatch, txn: Transaction) -> None:
        names = records.schema.names
        produce = producer.produce
        poll = producer.poll
        if "topic" not in names and "headers" not in names:
            topic = self.topic
            values = records.column(names.index("value")).to_pylist()
            key_column = records.column(names.index("key"))
            if key_column.null_count == len(key_column):
                for value in values:
                    try:
                        produce(topic, value)
                    except BufferError:
                        self._produce_when_room(producer, topic, value)
            else:
                for value, key in zip(values, key_column.to_pylist(), strict=True):
                    try:
                        produce(topic, value, key)
                    except BufferError:
                        self._produce_when_room(producer, topic, value, key)
        else:
            default = self.topic
            for topic, value, key, headers in iter_records(records):
                try:
                    produce(topic or default, value, key, headers=headers)
                except BufferError:
                    self._produce_when_room(producer, topic or default, value, key, headers)
        poll(0)

    def _produce_when_room(self, producer: Any, topic: str | None, value: bytes | None,
                           key: bytes | None = None, headers: Any = None) -> None:
        """The local queue is full: serve delivery reports until the record fits."""
        deadline = time.monotonic() + max(self.timeout_s, self.transaction_timeout_ms / 1000)
        while True:
            producer.poll(0.05)
            try:
                producer.produce(topic, value, key, headers=headers)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise

    def _error(self, exc: BaseException, txn: Transaction, phase: str,
               action: str) -> SparkEOSError:
        return translate(exc, sink=txn.sink, txn=txn, phase=phase, bootstrap=self.bootstrap,
                         action=action, transactional_id=self.transactional_id(txn))

    # -- staging helpers ------------------------------------------------------------------------
    def shared_paths(self) -> tuple[str, ...]:
        if self.mode != "staged" or not self.staging.needs_sharing:
            return ()
        return (self.staging.path,)

    def for_checkpoint(self, location: str, sink_name: str) -> KafkaSink:
        """Staged mode without a ``staging_dir``: stage under the query's checkpoint,
        which every driver restart finds and a cluster shares by construction."""
        if self.mode != "staged" or self.staging_dir:
            return self
        return dataclasses.replace(
            self, staging_dir=f"{location.rstrip('/')}/{CHECKPOINT_STAGING}/{sink_name}")

    @property
    def staging(self) -> StagingArea:
        # Unbound (a runner without a checkpoint, e.g. in-process tests): this host's dir.
        return StagingArea(self.staging_dir or default_staging_dir(),
                           prefix=self.transactional_id_prefix,
                           setting=f"KafkaSink(staging_dir=...) / ${STAGING_ENV}")

    def _delete_staged(self, txn: Transaction) -> None:
        self.staging.delete(txn)

    def _staged_path(self, txn: Transaction, receipt: Receipt) -> str | None:
        """The decided attempt's staged file; None if a twin commit (the driver and
        `recover --force`, a retried task) published it and deleted it since this one
        read the marker; ``DataLossError`` if it is gone and nobody committed it."""
        path = self.staging.staged_file(txn, receipt, self.transactional_id(txn))
        if path is not None:
            return path
        if self._committed_batch(txn, PHASE2, recovering=True) >= txn.batch_id:
            return None
        path = self.staging.files.uri(posixpath.join(self.staging.path, str(receipt["file"])))
        raise DataLossError(
            f"staged file {path} of a decided transaction is gone and the marker shows the "
            "transaction as not committed",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=self.transactional_id(txn),
            fix="something deleted the staging directory: restore it from a backup, or "
            "re-process this batch from the source. If the query was stopped for longer "
            "than the brokers' offsets.retention.minutes, the marker may have expired after "
            f"the batch was committed: check the topic, and if the batch is there, mark it "
            f"done with `sparkeos recover` or by committing offset {txn.batch_id + 1} for "
            f"group {self.marker_group(txn)!r} on {self.marker_topic}[0]",
        )


def _abort_quietly(producer: Any, timeout_s: float) -> None:
    try:
        producer.abort_transaction(timeout_s)
    except Exception:
        pass


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def read_topic(bootstrap_servers: str, topic: str, *, isolation: str = "read_committed",
               timeout_s: float = 30.0, config: Mapping[str, Any] | None = None,
               open_transactions: str = "skip") -> list[Any]:
    """Every message of ``topic`` (all partitions, from the start) as a
    ``read_committed`` consumer sees it now; for tests and checks.

    A transaction left open on a partition hides every record after its first one from
    a ``read_committed`` reader until it ends. ``open_transactions="skip"`` returns what
    is readable once the end stayed put a while; ``"fail"`` raises ``TimeoutError``
    instead (a check that must see every committed record: it cannot decide)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    def consumer_for(level: str) -> Any:
        return Consumer({
            **clients.common_config(config or {}),
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"sparkeos-read-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": level,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        })

    consumer = consumer_for(isolation)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            return []
        partitions = sorted(info.partitions)
        ends = {}
        # The high watermark, not a read_committed consumer's end (the last stable
        # offset), which lags a transaction that just committed.
        watermarks = consumer_for("read_uncommitted")
        try:
            for p in partitions:
                _low, high = watermarks.get_watermark_offsets(TopicPartition(topic, p),
                                                              timeout=timeout_s)
                ends[p] = high
        finally:
            watermarks.close()
        pending = {p for p in partitions if ends[p] > 0}
        if not pending:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        # commit_transaction returns once the coordinator logged the commit; the markers
        # reach the partitions just after, and until then a read_committed consumer
        # stops short of them. An end below the high watermark is accepted only after
        # it stayed put for a while (an open transaction of another producer).
        settle_s = min(timeout_s, 5.0) if open_transactions == "skip" else float("inf")
        short_since: dict[int, float] = {}
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    p, end = msg.partition(), msg.offset() or 0
                    now = time.monotonic()
                    if end >= ends[p] or now - short_since.setdefault(p, now) >= settle_s:
                        pending.discard(p)
                    else:
                        consumer.seek(TopicPartition(topic, p, end))  # ask again
                    continue
                raise RuntimeError(f"reading {topic}: {err}")
            short_since.pop(msg.partition(), None)
            out.append(msg)
            if (msg.offset() or 0) + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
        if pending:
            raise TimeoutError(f"reading {topic}: partitions {sorted(pending)} not drained "
                               f"within {timeout_s} s (a transaction open on them hides "
                               "the records after it)")
        return out
    finally:
        consumer.close()


__all__ = ["KafkaSink", "default_staging_dir", "read_topic"]
