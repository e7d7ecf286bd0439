"""How KafkaSink knows what it committed: markers and progress records.

The MARKER of a participant is a consumer-group offset committed inside its Kafka
transaction (``send_offsets_to_transaction``, KIP-98/447): group
``<marker_group_prefix><query>.<sink>.<destination hash>.p<partition>``, topic
``marker_topic`` partition 0, offset ``N + 1``, with what the transaction wrote (row
count and fingerprint, ``core.snapshot.fingerprint``) as the offset's metadata. It is visible
only if the transaction commits, so "batch N of participant p is committed" is
``committed offset >= N + 1``, and a replay of batch N skips participant p only when the
metadata names the rows it holds (``core.snapshot.replay``).

The same transaction writes a PROGRESS record to ``marker_topic`` (key: the group,
value ``{"batch": N, "rows": ..., "fingerprint": ...}``) before it commits; under
at-least-once also one right after it begins (so every open transaction of the sink
holds a record there, which ``pool`` finds after a crash). The topic is compacted, so
the last record of every participant outlives the offset, which the broker expires
after ``offsets.retention.minutes``.

The progress records also answer the lost-checkpoint guard
(``output_of_other_queries``): records of this sink name and destination under another
query key mean the output was written by a query whose checkpoint is gone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import RetriableError
from sparkeos.core.protocol import Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import OnRecord

from . import clients
from .config import KafkaConfig
from .errors import failed, short
from .producers import retrying
from .reader import read_topic


def identity(config: KafkaConfig) -> dict[str, Any]:
    """Where the output and its markers go. Not the bootstrap list: adding a broker to
    it is routine and must not look like another destination to the commit log."""
    return {"topic": config.topic, "topic_column": config.topic_column,
            "marker_topic": config.marker_topic,
            "marker_group_prefix": config.marker_group_prefix,
            "transactional_id_prefix": config.transactional_id_prefix}


def marker_group(config: KafkaConfig, txn: Transaction) -> str:
    return f"{marker_stem(config, txn.query_key, txn.sink)}.p{txn.partition}"


def marker_stem(config: KafkaConfig, query_key: str, sink: str) -> str:
    digest = hashlib.sha256(
        json.dumps(identity(config), sort_keys=True).encode()).hexdigest()[:10]
    return f"{config.marker_group_prefix}{query_key}.{sink}.{digest}"


@dataclass(frozen=True)
class Marker:
    """The last batch a participant committed (-1: none) and what it wrote (None when
    unknown: nothing committed, or a marker from before fingerprints were recorded)."""

    batch: int
    written: Written | None = None
    txn_id: str | None = None
    """The attempt that committed it (recorded since sparkeos names it; None before)."""

    def on_record(self) -> OnRecord:
        """The marker as the replay rule reads it (``core.snapshot.replay``)."""
        return OnRecord.last_batch(self.batch, self.written, self.txn_id)


NO_MARKER = Marker(-1)


def committed_batch(config: KafkaConfig, txn: Transaction, phase: str,
                    recovering: bool = False) -> int:
    """The last batch committed for ``txn``'s participant (-1 if none)."""
    return committed_marker(config, txn, phase, recovering).batch


def committed_marker(config: KafkaConfig, txn: Transaction, phase: str,
                     recovering: bool = False, timeout_s: float | None = None) -> Marker:
    """The participant's marker: the last batch committed and what it wrote.

    The marker offset answers in one call. It is absent before the participant's
    first commit, and after the broker expired it (``offsets.retention.minutes``
    after the last commit, when a query stayed down that long). Within a run a
    commit follows its decision at once, so absent means "not committed"; a
    recovery asks the progress records, which never expire, instead."""
    record = committed_record(config, txn, phase, recovering, timeout_s)
    if record is None:
        return NO_MARKER
    return Marker(int(record["batch"]), Written.from_json(record),
                  str(record["txn"]) if record.get("txn") else None)


def committed_record(config: KafkaConfig, txn: Transaction, phase: str,
                     recovering: bool = False, timeout_s: float | None = None
                     ) -> dict[str, Any] | None:
    """What the participant's last commit recorded (``batch``, and what
    ``commit_with_markers`` put beside it), from its marker offset; None when it has
    none. ``recovering``: from the progress records when the offset is absent (expired
    while the query was down)."""
    from confluent_kafka import TopicPartition

    group = marker_group(config, txn)
    client_config = config.client_config()
    try:
        with clients.held_marker_consumer(client_config, group) as consumer:
            parts = consumer.committed([TopicPartition(config.marker_topic, 0)],
                                       timeout=timeout_s or config.timeout_s)
    except BaseException as exc:
        clients.drop_consumer(client_config, group)
        raise failed(config, exc, txn, phase, f"marker read (group {group})") from None
    part = parts[0]
    if part.error is not None:
        raise failed(config, RuntimeError(str(part.error)), txn, phase, "marker read")
    offset = int(part.offset)
    if offset >= 0:
        return {**_metadata(part.metadata), "batch": offset - 1}
    return _last_progress(config, txn, phase) if recovering else None


def _metadata(metadata: Any) -> dict[str, Any]:
    """A marker's metadata as recorded (empty when it is not a JSON object)."""
    try:
        value = json.loads(metadata) if metadata else None
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def progress_batch(config: KafkaConfig, txn: Transaction, phase: str) -> int:
    """The batch of the participant's last committed progress record (-1 if none)."""
    return progress_marker(config, txn, phase).batch


def progress_marker(config: KafkaConfig, txn: Transaction, phase: str) -> Marker:
    """The participant's last committed progress record, as a marker: a read of the
    compacted marker topic with ``read_committed``."""
    record = _last_progress(config, txn, phase)
    if record is None:
        return NO_MARKER
    return Marker(int(record["batch"]), Written.from_json(record),
                  str(record["txn"]) if record.get("txn") else None)


def _last_progress(config: KafkaConfig, txn: Transaction, phase: str
                   ) -> dict[str, Any] | None:
    key = marker_group(config, txn).encode()
    try:
        records = _progress_records(config)
    except BaseException as exc:
        raise failed(config, exc, txn, phase, "progress read") from None
    last: dict[str, Any] | None = None
    for record in records:
        if record.key() != key:
            continue
        value = json.loads(record.value())
        batch = int(value["batch"])
        # Records come in offset order: of two of the same batch the later wins, unless
        # only the earlier says what it wrote (a real-time mark says it in "mark").
        known = Written.from_json(value) is not None
        if (last is None or batch > int(last["batch"])
                or (batch == int(last["batch"])
                    and (known or Written.from_json(last) is None))):
            last = value
    return last


def announce_open(config: KafkaConfig, producer: Any, txn: Transaction) -> None:
    """The first record of a transaction just begun, on ``config.announce_topic``: the
    transaction holds that topic from its start, so the next run finds it there if the
    writer dies with it open (``pool.close_open_transactions``)."""
    group = marker_group(config, txn)
    producer.produce(config.announce_topic, json.dumps({"batch": txn.batch_id}).encode(),
                     group.encode(), partition=0)
    if producer.flush(config.timeout_s):
        raise RuntimeError(f"the announcement of {group} was not delivered within "
                           f"{config.timeout_s} s")


def commit_with_marker(config: KafkaConfig, producer: Any, txn: Transaction,
                       written: Written | None, extra: dict[str, Any] | None = None) -> None:
    """Add the progress record and the marker to the producer's open transaction, and
    commit it: the records, the marker and the progress record become visible at
    once."""
    commit_with_markers(config, producer, [(txn, written)], extra)


def commit_with_markers(config: KafkaConfig, producer: Any,
                        participants: Sequence[tuple[Transaction, Written | None]],
                        extra: dict[str, Any] | None = None) -> None:
    """Add each participant's progress record and marker to the producer's open
    transaction (one consumer group per participant: a Kafka transaction takes the
    offsets of several groups), and commit it: the records, the markers and the
    progress records become visible at once. ``extra``: more fields for every
    participant's record (real-time mode's mark)."""
    from confluent_kafka import TopicPartition

    client_config = config.client_config()
    # The progress records: the markers that never expire (a compacted topic keeps the
    # last record per participant), in the same transaction as the records. Sent last,
    # so the shared marker topic is pinned only while the transaction commits.
    offsets = []
    for txn, written in participants:
        group = marker_group(config, txn)
        recorded = {**(written.as_json() if written else {}), **(extra or {}),
                    "txn": txn.txn_id}
        value = {"batch": txn.batch_id, **recorded}
        producer.produce(config.marker_topic, json.dumps(value).encode(), group.encode(),
                         partition=0)
        marker = [TopicPartition(config.marker_topic, 0, txn.batch_id + 1,
                                 metadata=json.dumps(recorded))]
        # The group's metadata is a value of its own: the consumer that gave it may be
        # closed (evicted from the cache) before the offsets are sent.
        with clients.held_marker_consumer(client_config, group) as consumer:
            offsets.append((marker, consumer.consumer_group_metadata()))
    for marker, metadata in offsets:
        def send(marker: list[Any] = marker, metadata: Any = metadata) -> None:
            producer.send_offsets_to_transaction(marker, metadata, config.timeout_s)
        retrying(config.timeout_s, send)
    retrying(config.timeout_s, lambda: producer.commit_transaction(config.timeout_s))


def output_of_other_queries(config: KafkaConfig, query_key: str, sink: str) -> str | None:
    """Progress records of this sink name and destination from other query keys."""
    mine = marker_stem(config, query_key, sink)
    pattern = re.compile(re.escape(config.marker_group_prefix) + r"([^.]+)\."
                         + re.escape(f"{sink}.{mine.rsplit('.', 1)[1]}") + r"\.p\d+$")
    try:
        records = _progress_records(config)
    except Exception as exc:
        # Fail closed: "no other output" must be known, never assumed; the check
        # runs again on the next batch.
        raise RetriableError(
            f"could not read the progress records in {config.marker_topic} on "
            f"{config.bootstrap}, which tell whether another query (a lost checkpoint) "
            f"already wrote sink {sink!r}: {short(exc)}",
            sink=sink,
            fix="make the marker topic readable (the broker up, the consumer allowed "
            "to read it, no transaction left open on it for longer than "
            "transaction.timeout.ms) and restart the query; or pass "
            "existing_output='accept' (to exactly_once or exactly_once_writer) if you "
            "know there is none; nothing was written",
        ) from None
    others: dict[str, int] = {}
    for record in records:
        match = pattern.match((record.key() or b"").decode(errors="replace"))
        if match and match.group(1) != query_key:
            batch = int(json.loads(record.value())["batch"])
            others[match.group(1)] = max(others.get(match.group(1), -1), batch)
    if not others:
        return None
    return f"progress records in {config.marker_topic} of query keys " + ", ".join(
        f"{key} (batches up to {last})" for key, last in sorted(others.items()))


def _progress_records(config: KafkaConfig) -> list[Any]:
    # "fail": a check that must see every committed record cannot decide while a
    # transaction is left open on the marker topic.
    return read_topic(config.bootstrap_servers, config.marker_topic,
                      timeout_s=config.timeout_s, config=config.producer_config,
                      open_transactions="fail")
