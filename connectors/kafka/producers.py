"""The transactional producer's lifecycle, and the retry policy of its calls.

``init_producer`` creates a producer with the participant's ``transactional.id``,
connects and runs ``init_transactions`` (which fences every earlier producer of the ID
and aborts what it left open); ``phase2_producer`` takes the one this process kept
from an earlier batch instead, where there is one (``clients`` says why that is safe);
``produce`` sends serialised records, waiting for room when the
local queue is full; ``abort_quietly`` / ``clients.close_quietly`` end it.
``retrying`` retries a transactional API call on retriable errors within the sink's
``timeout_s``; a whole phase-2 publish is retried by ``publish``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa

from sparkeos.core.protocol import Transaction
from sparkeos.core.text.records import iter_records

from . import clients
from .config import KafkaConfig
from .errors import failed, is_retriable, requires_abort

T = TypeVar("T")


def init_producer(config: KafkaConfig, txn: Transaction, phase: str) -> Any:
    """A producer of ``txn``'s participant, ready to begin a transaction."""
    tid = config.transactional_id(txn)
    try:
        producer = clients.new_producer(config.producer_settings(tid))
    except BaseException as exc:
        raise failed(config, exc, txn, phase, "producer creation") from None
    try:
        # Connect first. librdkafka 2.16 drops the bootstrap connection once the
        # first metadata names the real broker; init_transactions that finds no
        # connection up waits for the 500 ms coordinator-query timer (measured: about
        # every other producer). Two metadata requests leave the real broker
        # connected: producer creation to initialised is then a steady ~57 ms.
        for _ in range(2):
            producer.list_topics(config.marker_topic, timeout=config.timeout_s)
        retrying(config.timeout_s, lambda: producer.init_transactions(config.timeout_s))
    except BaseException as exc:
        clients.close_quietly(producer)
        raise failed(config, exc, txn, phase, "init_transactions") from None
    return producer


def phase2_producer(config: KafkaConfig, txn: Transaction, phase: str) -> tuple[Any, bool]:
    """A producer for one phase-2 transaction of ``txn``'s participant, and whether it
    was kept from an earlier one (not fenced by this commit: ``clients``)."""
    kept = clients.take_producer(config.producer_settings(config.transactional_id(txn)))
    if kept is not None:
        return kept, True
    return init_producer(config, txn, phase), False


def in_spark_task() -> bool:
    """Whether this runs inside a Spark task (phase 2 of foreachBatch), not in the
    format's commit worker or a driver."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def retrying(timeout_s: float, call: Callable[[], T]) -> T:
    """Retry a transactional API call on retriable errors, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
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


def abort_quietly(producer: Any, timeout_s: float) -> None:
    try:
        producer.abort_transaction(timeout_s)
    except Exception:
        pass


def produce(config: KafkaConfig, producer: Any, records: pa.RecordBatch) -> None:
    """Send serialised records (``RecordLayout.serialize``) in the open transaction."""
    names = records.schema.names
    if "topic" in names or "headers" in names:
        default = config.topic
        for topic, value, key, headers in iter_records(records):
            try:
                producer.produce(topic or default, value, key, headers=headers)
            except BufferError:
                _produce_when_room(config, producer, topic or default, value, key, headers)
    else:
        _produce_to_topic(config, producer, records)
    producer.poll(0)


def _produce_to_topic(config: KafkaConfig, producer: Any, records: pa.RecordBatch) -> None:
    # The common case (one topic, no headers) without a tuple per record: the hot loop.
    names = records.schema.names
    produce_ = producer.produce
    topic = config.topic
    values = records.column(names.index("value")).to_pylist()
    key_column = records.column(names.index("key"))
    if key_column.null_count == len(key_column):
        for value in values:
            try:
                produce_(topic, value)
            except BufferError:
                _produce_when_room(config, producer, topic, value)
    else:
        for value, key in zip(values, key_column.to_pylist(), strict=True):
            try:
                produce_(topic, value, key)
            except BufferError:
                _produce_when_room(config, producer, topic, value, key)


def _produce_when_room(config: KafkaConfig, producer: Any, topic: str | None,
                       value: bytes | None, key: bytes | None = None,
                       headers: Any = None) -> None:
    """The local queue is full: serve delivery reports until the record fits."""
    deadline = time.monotonic() + max(config.timeout_s, config.transaction_timeout_ms / 1000)
    while True:
        producer.poll(0.05)
        try:
            producer.produce(topic, value, key, headers=headers)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise
