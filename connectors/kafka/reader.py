"""Reading a whole topic as a ``read_committed`` consumer sees it now.

``read_topic`` serves tests and checks, and the sink itself: the progress records of
the marker topic are read with it (recovery of an expired marker, the lost-checkpoint
guard). Its difficulty is knowing when the read is complete: it reads each partition up
to the high watermark, and tells a transaction that just committed (its markers are on
their way) from one left open (it hides every record after it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from . import clients


def read_topic(bootstrap_servers: str, topic: str, *, isolation: str = "read_committed",
               timeout_s: float = 30.0, config: Mapping[str, Any] | None = None,
               open_transactions: str = "skip") -> list[Any]:
    """Every message of ``topic`` (all partitions, from the start) as a
    ``read_committed`` consumer sees it now; for tests and checks.

    A transaction left open on a partition hides every record after its first one from
    a ``read_committed`` reader until it ends. ``open_transactions="skip"`` returns what
    is readable once the end stayed put a while; ``"fail"`` raises ``TimeoutError``
    instead (a check that must see every committed record: it cannot decide)."""
    from confluent_kafka import TopicPartition

    consumer = _consumer(bootstrap_servers, config, isolation)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            return []
        ends = _high_watermarks(bootstrap_servers, config, topic, sorted(info.partitions),
                                timeout_s)
        pending = {p for p, end in ends.items() if end > 0}
        if not pending:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        # commit_transaction returns once the coordinator logged the commit; the markers
        # reach the partitions just after, and until then a read_committed consumer
        # stops short of them. An end below the high watermark is accepted only after
        # it stayed put for a while (an open transaction of another producer).
        settle_s = min(timeout_s, 5.0) if open_transactions == "skip" else float("inf")
        return _drain(consumer, topic, ends, pending, timeout_s, settle_s)
    finally:
        consumer.close()


def _consumer(bootstrap_servers: str, config: Mapping[str, Any] | None, level: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({
        **clients.common_config(config or {}),
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"sparkeos-read-{os.getpid()}-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "isolation.level": level,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        # The end of a partition is known when a fetch comes back empty; the broker
        # holds an empty fetch this long (default 500 ms, paid once per read).
        "fetch.wait.max.ms": 10,
    })


def _high_watermarks(bootstrap_servers: str, config: Mapping[str, Any] | None, topic: str,
                     partitions: list[int], timeout_s: float) -> dict[int, int]:
    """The high watermark of each partition, not a read_committed consumer's end (the
    last stable offset), which lags a transaction that just committed."""
    from confluent_kafka import TopicPartition

    watermarks = _consumer(bootstrap_servers, config, "read_uncommitted")
    try:
        ends = {}
        for p in partitions:
            _low, high = watermarks.get_watermark_offsets(TopicPartition(topic, p),
                                                          timeout=timeout_s)
            ends[p] = high
        return ends
    finally:
        watermarks.close()


_BATCH = 10_000
"""Messages per ``consume`` call at most."""
_WAIT_S = 0.02
"""How long one ``consume`` call waits for ``_BATCH`` messages (it returns what came
by then): short, so the read ends soon after the last partition's end."""


def _drain(consumer: Any, topic: str, ends: dict[int, int], pending: set[int],
           timeout_s: float, settle_s: float) -> list[Any]:
    """Poll until every pending partition reached its end (or an end short of it stayed
    put for ``settle_s``); ``TimeoutError`` if some did not within ``timeout_s``."""
    from confluent_kafka import KafkaError, TopicPartition

    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    short_since: dict[int, float] = {}
    while pending and time.monotonic() < deadline:
        # Many at a time: the marker topic of a busy broker holds thousands of
        # progress records, and a poll() per record cost about 0.2 ms each.
        for msg in consumer.consume(_BATCH, _WAIT_S):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    p, end = msg.partition(), msg.offset() or 0
                    now = time.monotonic()
                    if p not in pending:
                        continue
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
