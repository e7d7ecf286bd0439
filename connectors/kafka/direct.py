"""Direct mode: the task's own Kafka transaction, committed at the end of phase 1.

Opt-in, at-least-once with replay deduplication (the records are visible before the
batch is decided, see ``sink``). ``begin`` fences earlier producers of the
participant's ID, reads its marker and opens a transaction (its progress record first,
so a recovery finds it if the task dies: ``pool``); ``produce`` sends as the task
writes; ``finish`` commits the records with the marker, or, when the marker shows the
same rows committed for this (batch, partition) before (a replay partitioned as the run
that committed), aborts them (``core.snapshot.replay``); ``abort`` ends the transaction when the
attempt fails.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import replay

from . import clients, markers, producers
from .config import KafkaConfig
from .errors import PHASE1, failed, underlying


def begin(config: KafkaConfig, txn: Transaction) -> tuple[Any, markers.Marker]:
    """A producer with an open transaction for ``txn``, and the participant's marker."""
    producer = producers.init_producer(config, txn, PHASE1)
    try:
        marker = markers.committed_marker(config, txn, PHASE1)
        producer.begin_transaction()
        markers.announce_open(config, producer, txn)  # direct mode: at-least-once
    except BaseException as exc:
        exc = underlying(producer, exc)
        producers.abort_quietly(producer, config.timeout_s)
        clients.close_quietly(producer)
        raise failed(config, exc, txn, PHASE1, "begin transaction") from None
    return producer, marker


def produce(config: KafkaConfig, producer: Any, records: pa.RecordBatch,
            txn: Transaction) -> None:
    try:
        producers.produce(config, producer, records)
    except BaseException as exc:
        raise failed(config, underlying(producer, exc), txn, PHASE1, "produce") from None


def finish(config: KafkaConfig, producer: Any, txn: Transaction, marker: markers.Marker,
           written: Written) -> Receipt:
    """Commit the task's records with the marker, unless the same rows were committed
    for this (batch, partition) before: then abort them. The producer is closed."""
    met = replay(txn, written, marker.on_record())
    if met.skip:
        abort(config, producer)
        return {"mode": "direct", "rows": 0, "skipped": True, **met.receipt_fields()}
    commit(config, producer, txn, written)
    return {"mode": "direct", "rows": written.rows, "skipped": False, **met.receipt_fields()}


def commit(config: KafkaConfig, producer: Any, txn: Transaction, written: Written | None,
           extra: dict[str, Any] | None = None) -> None:
    """Commit the task's records with the marker (``extra``: more fields for its
    record); the producer is closed either way."""
    try:
        markers.commit_with_marker(config, producer, txn, written, extra)
    except BaseException as exc:
        exc = underlying(producer, exc)
        producers.abort_quietly(producer, config.timeout_s)
        raise failed(config, exc, txn, PHASE1, "commit transaction") from None
    finally:
        clients.close_quietly(producer)


def abort(config: KafkaConfig, producer: Any) -> None:
    producers.abort_quietly(producer, config.timeout_s)
    clients.close_quietly(producer)
