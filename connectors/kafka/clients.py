"""confluent-kafka clients, created lazily and cached per Python process.

Sinks are pickled to Spark's Python workers; clients never are.

Transactional producers of phase 2 are kept between batches (``take_producer`` /
``keep_producer``), at most ``_MAX_PRODUCERS`` per process, outside Spark tasks (the
format's commit worker, a driver): creating one and its ``init_transactions`` cost about
60 to 110 ms, once per participant and batch without the cache. (A Spark task's next
commit of an ID lands in any Python worker, so there a kept producer would mostly be
fenced before its reuse.) ``init_transactions`` fences every earlier producer of the
same transactional ID and aborts whatever it left open; librdkafka allows it once per
producer instance. A kept producer skips it, which is safe because (1) a producer is
kept only after a clean end (its transaction committed or never begun), so nothing of
its own is open; (2) a producer is taken out of the cache for the whole commit, so two
committers of this process never share one; (3) any other producer of the ID that
started since (a twin commit, a recovery) bumped the ID's epoch, so the broker refuses
every transactional request of the kept one (``ProducerFenced``) and it can commit
nothing. Any failure of a kept producer's publish (fenced; its marker read, kept short,
held by offsets a dead twin left pending) starts it over at once with a fresh producer,
whose ``init_transactions`` fences the other and aborts what it left open. Direct-mode
tasks and rollbacks always start a fresh producer: their ``init_transactions`` is the
point.

Marker consumers (never subscribed; used to read a marker group's committed offset
and to get its group metadata) and admin clients hold no transactional state, so
each Python worker keeps up to ``_MAX_CACHED`` of them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

_MAX_CACHED = 64
_MAX_PRODUCERS = 64
_lock = threading.RLock()
_consumers: OrderedDict[tuple[str, str], Any] = OrderedDict()
_holders: Counter[int] = Counter()
"""How many users hold each cached consumer (by ``id``): an evicted one is closed only
when none does."""
_retired: dict[int, Any] = {}
"""Consumers evicted while held, closed by their last holder."""
_admins: dict[str, Any] = {}
_producers: OrderedDict[str, Any] = OrderedDict()
"""Idle phase-2 producers by their settings (``transactional.id`` included)."""
_producers_pid = os.getpid()

# Keys KafkaSink sets itself; setting them in producer_config is an error.
OWNED_KEYS = frozenset({
    "bootstrap.servers", "metadata.broker.list", "transactional.id", "transaction.timeout.ms",
    "enable.idempotence", "group.id", "isolation.level", "enable.auto.commit",
})

# Producer-only librdkafka properties: not passed to the marker consumer / admin client
# (librdkafka would warn about each one).
PRODUCER_ONLY = frozenset({
    "acks", "request.required.acks", "linger.ms", "queue.buffering.max.ms", "batch.size",
    "batch.num.messages", "compression.type", "compression.codec", "compression.level",
    "queue.buffering.max.messages", "queue.buffering.max.kbytes", "message.timeout.ms",
    "delivery.timeout.ms", "retries", "message.send.max.retries", "partitioner",
    "partitioner_cb", "enable.gapless.guarantee", "delivery.report.only.error", "dr_cb",
    "dr_msg_cb", "on_delivery", "sticky.partitioning.linger.ms", "request.timeout.ms",
    "queue.buffering.backpressure.threshold", "produce.offset.report", "msg_order_cmp",
    "message.copy.max.bytes", "retry.backoff.max.ms", "transactional.id",
    "transaction.timeout.ms", "enable.idempotence",
})


def fingerprint(config: Mapping[str, Any]) -> str:
    return repr(sorted((str(k), repr(v)) for k, v in config.items()))


def common_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without producer-only properties (for consumers and admin clients)."""
    return {k: v for k, v in config.items() if k not in PRODUCER_ONLY}


def new_producer(config: Mapping[str, Any]) -> Any:
    from confluent_kafka import Producer

    return Producer(dict(config))


def take_producer(settings: Mapping[str, Any]) -> Any | None:
    """This process's idle producer of these settings, taken out of the cache (the
    caller has it alone until ``keep_producer``), or None."""
    global _producers_pid
    with _lock:
        if _producers_pid != os.getpid():  # a forked child: its parent's clients are not its
            _producers.clear()
            _producers_pid = os.getpid()
        return _producers.pop(fingerprint(settings), None)


def keep_producer(settings: Mapping[str, Any], producer: Any) -> None:
    """Keep a producer whose last transaction ended cleanly (committed, or none begun)
    for the next commit of its transactional ID in this process."""
    evicted = []
    with _lock:
        if _producers_pid != os.getpid():
            evicted.append(producer)
        else:
            key = fingerprint(settings)
            previous = _producers.pop(key, None)
            if previous is not None:
                evicted.append(previous)
            _producers[key] = producer
            while len(_producers) > _MAX_PRODUCERS:
                evicted.append(_producers.popitem(last=False)[1])
    for p in evicted:
        close_quietly(p)


def marker_consumer(config: Mapping[str, Any], group: str) -> Any:
    """A consumer (never subscribed) of ``group``: reads its committed offsets and
    provides the group metadata for ``send_offsets_to_transaction``. The cache may close
    it once more groups were used since: hold it with ``held_marker_consumer`` while
    using it."""
    consumer = _take_consumer(config, group)
    _release_consumer(consumer)
    return consumer


@contextlib.contextmanager
def held_marker_consumer(config: Mapping[str, Any], group: str) -> Iterator[Any]:
    """``marker_consumer``, which the cache does not close while it is held (a commit
    that reads many participants' markers, or threads committing beside each other,
    use more groups than the cache keeps)."""
    consumer = _take_consumer(config, group)
    try:
        yield consumer
    finally:
        _release_consumer(consumer)


def _take_consumer(config: Mapping[str, Any], group: str) -> Any:
    key = (fingerprint(config), group)
    with _lock:
        consumer = _consumers.pop(key, None)
        if consumer is not None:
            _consumers[key] = consumer
            _holders[id(consumer)] += 1
            return consumer
    from confluent_kafka import Consumer

    created = Consumer({
        **common_config(config),
        "group.id": group,
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    to_close = []
    with _lock:
        consumer = _consumers.pop(key, None)
        if consumer is None:  # else another thread cached one meanwhile: use that
            consumer = created
        else:
            to_close.append(created)
        _consumers[key] = consumer
        _holders[id(consumer)] += 1
        while len(_consumers) > _MAX_CACHED:
            evicted = _consumers.popitem(last=False)[1]
            if _holders[id(evicted)]:
                _retired[id(evicted)] = evicted  # closed by its last holder
            else:
                _holders.pop(id(evicted), None)
                to_close.append(evicted)
    for c in to_close:
        close_quietly(c)
    return consumer


def _release_consumer(consumer: Any) -> None:
    with _lock:
        _holders[id(consumer)] -= 1
        if _holders[id(consumer)] > 0:
            return
        del _holders[id(consumer)]
        retired = _retired.pop(id(consumer), None)
    if retired is not None:
        close_quietly(retired)


def drop_consumer(config: Mapping[str, Any], group: str) -> None:
    with _lock:
        consumer = _consumers.pop((fingerprint(config), group), None)
        if consumer is not None and _holders[id(consumer)]:
            _retired[id(consumer)] = consumer
            consumer = None
    if consumer is not None:
        close_quietly(consumer)


def admin_client(config: Mapping[str, Any]) -> Any:
    key = fingerprint(config)
    with _lock:
        admin = _admins.get(key)
        if admin is None:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient(common_config(config))
            _admins[key] = admin
        return admin


def probe_brokers(config: Mapping[str, Any], timeout_s: float) -> None:
    """Raise unless the brokers answer a metadata request; the client is closed either
    way (an AdminClient cannot be closed, so it is only made once this passed)."""
    from confluent_kafka import Consumer

    consumer = Consumer({**common_config(config), "group.id": "sparkeos-probe",
                         "enable.auto.commit": False})
    try:
        consumer.list_topics(timeout=timeout_s)
    finally:
        consumer.close()


def topic_available(config: Mapping[str, Any], topic: str, timeout_s: float) -> bool:
    """Does ``topic`` exist, or will the brokers create it on first use
    (``auto.create.topics.enable``)? Asked with a client that is closed afterwards;
    brokers that do not let us read their configuration get the benefit of the doubt."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    consumer = Consumer({**common_config(config), "group.id": "sparkeos-probe",
                         "enable.auto.commit": False})
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    finally:
        consumer.close()
    if topic in metadata.topics:
        return True
    try:
        broker = str(sorted(metadata.brokers)[0])
        futures = admin_client(config).describe_configs(
            [ConfigResource(ResourceType.BROKER, broker)], request_timeout=timeout_s)
        entries = next(iter(futures.values())).result(timeout=timeout_s)
        auto_create = entries.get("auto.create.topics.enable")
        return str(getattr(auto_create, "value", "true")).lower() != "false"
    except Exception:
        return True


def drop_admin(config: Mapping[str, Any]) -> None:
    with _lock:
        _admins.pop(fingerprint(config), None)


def close_quietly(client: Any) -> None:
    """Close a producer or consumer without waiting for anything."""
    try:
        if hasattr(client, "purge"):
            client.purge()
            client.flush(0)
        client.close() if hasattr(client, "close") else None
    except Exception:
        pass


def clear_caches() -> None:
    """Close every cached client of this process (tests, benchmarks)."""
    with _lock:
        clients = list(_consumers.values())
        if _producers_pid == os.getpid():
            clients += list(_producers.values())
        _consumers.clear()
        _producers.clear()
        _admins.clear()
    for c in clients:
        close_quietly(c)
