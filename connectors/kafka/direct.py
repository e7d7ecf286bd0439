"""Direct mode: the task's own Kafka transaction, committed at the end of phase 1.

Opt-in, at-least-once with replay deduplication (the records are visible before the
batch is decided, see ``sink``). ``begin`` fences earlier producers of the
participant's ID and skips a (batch, partition) whose marker is committed (a re-run);
``produce`` sends as the task writes; ``commit`` adds the marker and commits;
``abort`` ends the transaction when the attempt fails.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkeos.core.protocol import Transaction

from . import clients, markers, producers
from .config import KafkaConfig
from .errors import PHASE1, failed, underlying


def begin(config: KafkaConfig, txn: Transaction) -> Any:
    """A producer with an open transaction for ``txn``; None if the marker says the
    (batch, partition) is committed already (a re-run: nothing is to be written)."""
    producer = producers.init_producer(config, txn, PHASE1)
    try:
        if markers.committed_batch(config, txn, PHASE1) >= txn.batch_id:
            clients.close_quietly(producer)
            return None
        producer.begin_transaction()
    except BaseException as exc:
        clients.close_quietly(producer)
        raise failed(config, exc, txn, PHASE1, "begin transaction") from None
    return producer


def produce(config: KafkaConfig, producer: Any, records: pa.RecordBatch,
            txn: Transaction) -> None:
    try:
        producers.produce(config, producer, records)
    except BaseException as exc:
        raise failed(config, underlying(producer, exc), txn, PHASE1, "produce") from None


def commit(config: KafkaConfig, producer: Any, txn: Transaction) -> None:
    """Commit the task's records with the marker; the producer is closed either way."""
    try:
        markers.commit_with_marker(config, producer, txn)
    except BaseException as exc:
        exc = underlying(producer, exc)
        producers.abort_quietly(producer, config.timeout_s)
        raise failed(config, exc, txn, PHASE1, "commit transaction") from None
    finally:
        clients.close_quietly(producer)


def abort(config: KafkaConfig, producer: Any) -> None:
    producers.abort_quietly(producer, config.timeout_s)
    clients.close_quietly(producer)
