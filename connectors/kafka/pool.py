"""Transactions a dead writer left open, found on the marker topic and closed by ID.

A Kafka transaction left open by a killed task pins the last stable offset of every
partition it wrote: a ``read_committed`` reader sees nothing past it until the broker
aborts it after ``transaction.timeout.ms``, or until a producer of the same
``transactional.id`` calls ``init_transactions`` (which aborts it and fences the dead
writer). Under exactly-once, recovery does that for every decided participant. Under
at-least-once nobody commits the dead run's participants again, and a restart with
fewer writers never reuses the IDs of the partitions it no longer has (Flink's pooled-ID
bug, FLINK-40626): so before the first batch of a query run, ``close_open_transactions``
finds every transaction of this (query, sink) still open, whatever the partition count of
the run that left it, and initialises its ID.

How they are found: under at-least-once every transaction of the sink first announces
itself on the announcement topic (``<marker topic>-open``, ``markers.announce_open``), so
every open one holds a record on that topic's partition at or past its last stable
offset. Reading that tail with ``read_uncommitted`` (usually empty: a few records) names
the participants and slots (``batch % 2``) whose IDs to initialise. No scan of the sink's
output topics, no list of transactions from the broker (librdkafka has no such call).
The announcements are not on the marker topic: there an open one would hide every other
query's progress records from their recoveries' ``read_committed`` reads.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparkeos.core.observe import log_event
from sparkeos.core.snapshot.txpool import TransactionPool

from . import clients, markers
from .config import KafkaConfig
from .errors import DRIVER, translate
from .producers import retrying

_PARALLEL = 8


def close_open_transactions(config: KafkaConfig, query_key: str, sink: str) -> list[str]:
    """Initialise (abort and fence) the ID of every transaction of this (query, sink)
    left open on the announcement topic; returns the IDs."""
    stem = markers.marker_stem(config, query_key, sink) + ".p"
    try:
        found = _participants_past_stable_offset(config, stem)
    except Exception as exc:
        raise translate(exc, sink=sink, txn=None, phase=DRIVER, bootstrap=config.bootstrap,
                        action="reading the announcement topic for transactions left "
                        "open"
                        ) from None
    pool = TransactionPool(query_key, sink)
    ids = sorted({config.transactional_id_prefix + pool.participant_id(p, batch % 2)
                  for p, batch in found})
    if not ids:
        return []
    with ThreadPoolExecutor(min(_PARALLEL, len(ids)),
                            thread_name_prefix="sparkeos-kafka-close") as workers:
        list(workers.map(lambda tid: _initialise(config, tid), ids))
    log_event("kafka.open_transactions_closed", logging.WARNING, sink=sink, query=query_key,
              transactional_ids=len(ids), detail="a run that died left them open; their "
              "partitions' last stable offset moves on")
    return ids


def _initialise(config: KafkaConfig, transactional_id: str) -> None:
    producer = clients.new_producer(config.producer_settings(transactional_id))
    try:
        retrying(config.timeout_s, lambda: producer.init_transactions(config.timeout_s))
    finally:
        clients.close_quietly(producer)


def _participants_past_stable_offset(config: KafkaConfig, stem: str) -> set[tuple[int, int]]:
    """(partition, batch) of every announcement of ``stem`` on the announcement topic's
    partition from its last stable offset on: the transactions still open there, and
    any that ended after the first of them began."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    part = TopicPartition(config.announce_topic, 0)
    common = {**clients.common_config(config.client_config()), "enable.auto.commit": False,
              "group.id": f"sparkeos-pool-{time.monotonic_ns()}"}
    committed = Consumer({**common, "isolation.level": "read_committed"})
    try:
        if config.announce_topic not in committed.list_topics(
                timeout=config.timeout_s).topics:
            return set()  # nothing was ever announced on this cluster
        _low, stable = committed.get_watermark_offsets(part, timeout=config.timeout_s)
    finally:
        committed.close()
    everything = Consumer({**common, "isolation.level": "read_uncommitted",
                           "enable.partition.eof": True})
    found: set[tuple[int, int]] = set()
    try:
        _low, high = everything.get_watermark_offsets(part, timeout=config.timeout_s)
        if high <= stable:
            return found
        everything.assign([TopicPartition(config.announce_topic, 0, stable)])
        deadline = time.monotonic() + config.timeout_s
        while time.monotonic() < deadline:
            msg = everything.poll(0.2)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    break
                raise RuntimeError(str(error))
            _note(found, stem, msg)
            if (msg.offset() or 0) + 1 >= high:
                break
        else:
            raise TimeoutError(f"{config.announce_topic}[0] not read up to offset {high} "
                               f"within {config.timeout_s} s")
    finally:
        everything.close()
    return found


def _note(found: set[tuple[int, int]], stem: str, msg: Any) -> None:
    key = (msg.key() or b"").decode(errors="replace")
    if not key.startswith(stem) or not key[len(stem):].isdigit():
        return
    try:
        batch = int(json.loads(msg.value())["batch"])
    except (TypeError, ValueError, KeyError):
        return
    found.add((int(key[len(stem):]), batch))


__all__ = ["close_open_transactions"]
