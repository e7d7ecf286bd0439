"""Transactions a dead run left open never pin a reader after the restart, whatever
the restart's partition count (Flink's pooled-ID bug, FLINK-40626).

A process opens Kafka transactions for 8 participants, writes into them and is killed
(kill -9: nothing aborts them). The restart runs with 1 participant. A ``read_committed``
reader's last stable offset (LSO) of every output partition and of the marker topic
must reach the high watermark within 30 s after the restart's first batch: without the
fix it stayed pinned for the whole ``transaction.timeout.ms``. The marker topic, which
every query's recovery reads ``read_committed``, is never pinned by the dead run's
at-least-once transactions: they announce themselves on ``<marker topic>-open``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkeos.connectors.kafka import KafkaSink, read_topic
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import DIRECT_RUNS
from sparkeos.core.storage.logstores import LocalStore
from sparkeos.testing.inprocess import ListRunner

from .conftest import create_topic, unique_name

WRITERS = 8
BOUND_S = 30.0
QUERY_KEY = "poolq"


def sink_kwargs(bootstrap: str, topic: str, tmp_path: Any, mode: str) -> dict[str, Any]:
    # A marker topic of its own: another test's transaction open on the shared one
    # would read as pinned here.
    return {"bootstrap_servers": bootstrap, "topic": topic, "mode": mode,
            "marker_topic": f"{topic}-markers",
            "staging_dir": str(tmp_path / "staging"),
            "transactional_id_prefix": unique_name(str(tmp_path), "t") + "-",
            "transaction_timeout_ms": 600_000, "timeout_s": 20.0}


def die_with_open_transactions(kwargs: dict[str, Any], sink_name: str, batch_id: int,
                               run: int, guarantee: Guarantee,
                               with_markers: bool = False) -> None:
    """A child process begins the transactions of ``WRITERS`` participants of
    ``batch_id`` as the sink does under ``guarantee`` (direct tasks, or phase-2
    publishes), writes into each, then is killed: each stays open on the broker."""
    # The driver's checks: the marker topic (and the announcement topic) made.
    KafkaSink(**kwargs).for_guarantee(guarantee).check_broker()
    code = textwrap.dedent(f"""
        import os
        from sparkeos.connectors.kafka import KafkaSink, markers, producers
        from sparkeos.core.config import Guarantee
        from sparkeos.core.snapshot.txpool import TransactionPool
        from sparkeos.testing.inprocess import id_batch
        sink = KafkaSink(**{kwargs!r}).for_guarantee(Guarantee({guarantee.value!r}))
        pool = TransactionPool({QUERY_KEY!r}, {sink_name!r})
        for p in range({WRITERS}):
            txn = pool.transaction({batch_id}, p, {run}, 0)
            producer = producers.init_producer(sink, txn, "phase 1")
            producer.begin_transaction()
            if sink.announces_open:
                markers.announce_open(sink, producer, txn)
            producers.produce(sink, producer, sink.layout().serialize(id_batch([p])))
            if {with_markers!r}:  # the marker offset pending too, as at "produced"
                from confluent_kafka import TopicPartition
                from sparkeos.connectors.kafka import clients
                consumer = clients.marker_consumer(sink.client_config(),
                                                   markers.marker_group(sink, txn))
                producer.send_offsets_to_transaction(
                    [TopicPartition(sink.marker_topic, 0, {batch_id} + 1)],
                    consumer.consumer_group_metadata(), 20)
            producer.flush(10)
        os.kill(os.getpid(), 9)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == -9, result.stderr[-2000:]


def pinned(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """Partitions of the output, marker and announcement topics whose last stable offset
    (what a read_committed reader reaches) is short of the high watermark: {partition:
    (LSO, HWM)}."""
    found: dict[str, list[int]] = {}
    for name, partitions in ((topic, (0, 1)), (f"{topic}-markers", (0,)),
                             (f"{topic}-markers-open", (0,))):
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lso-check",
                                 "isolation.level": isolation})
            try:
                if name not in consumer.list_topics(timeout=20).topics:
                    continue  # no announcement topic under exactly-once
                for p in partitions:
                    _low, end = consumer.get_watermark_offsets(TopicPartition(name, p),
                                                               timeout=20)
                    found.setdefault(f"{name}[{p}]", []).append(end)
            finally:
                consumer.close()
    return {k: (v[0], v[1]) for k, v in found.items() if v[0] < v[1]}


def unpinned_within(bootstrap: str, topic: str, bound_s: float) -> dict[str, Any]:
    """Wait (polling) until no partition is pinned, at most ``bound_s``; what is still
    pinned then."""
    deadline = time.monotonic() + bound_s
    while True:
        left = pinned(bootstrap, topic)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.parametrize("mode", ["direct", "staged"])
def test_at_least_once_restart_with_one_writer_closes_what_eight_left_open(
        kafka_bootstrap: str, tmp_path: Any, mode: str) -> None:
    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic, partitions=2)
    kwargs = sink_kwargs(kafka_bootstrap, topic, tmp_path, mode)
    name = f"pool-{mode}"
    die_with_open_transactions(kwargs, name, batch_id=3, run=DIRECT_RUNS.start + 7,
                               guarantee=Guarantee.AT_LEAST_ONCE)
    left_open = pinned(kafka_bootstrap, topic)
    assert left_open, "the killed writers left nothing open"
    assert f"{topic}-markers[0]" not in left_open, (
        f"an at-least-once transaction pinned the marker topic: {left_open}")
    config = CoordinatorConfig(name=name, guarantee=Guarantee.AT_LEAST_ONCE)
    restart = Coordinator(KafkaSink(**kwargs), config, None, QUERY_KEY)
    restart.run_batch(3, ListRunner([[100, 101]]))
    left = unpinned_within(kafka_bootstrap, topic, BOUND_S)
    assert not left, (f"last stable offsets pinned {BOUND_S:.0f} s after the restart's first "
                      f"batch (LSO, HWM): {left}")
    values = [json.loads(m.value())["id"] for m in read_topic(kafka_bootstrap, topic)]
    assert sorted(values) == [100, 101], "the dead writers' records stayed invisible"


def test_exactly_once_recovery_closes_what_a_dead_phase_2_left_open(
        kafka_bootstrap: str, tmp_path: Any) -> None:
    """Batch 0 is decided with 8 participants; their phase-2 publishes open their
    transactions and die. The restart, with 1 participant, recovers batch 0 first: each
    decided participant's ID is initialised again (aborting what was open) and its
    staged records published."""
    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic, partitions=2)
    kwargs = sink_kwargs(kafka_bootstrap, topic, tmp_path, "staged")
    log = CommitLog(LocalStore(str(tmp_path / "log")))
    config = CoordinatorConfig(name="pool-eo")
    crashing = Coordinator(KafkaSink(**kwargs), config, log, QUERY_KEY,
                           FaultPlan("after_decided", 0, simulate=True))
    with pytest.raises(InjectedCrash):
        crashing.run_batch(0, ListRunner([[p] for p in range(WRITERS)]))
    decided = log.batches()[0].decided_run
    assert decided is not None
    die_with_open_transactions(kwargs, "pool-eo", batch_id=0, run=decided,
                               guarantee=Guarantee.EXACTLY_ONCE)
    assert pinned(kafka_bootstrap, topic)
    restart = Coordinator(KafkaSink(**kwargs), config, log, QUERY_KEY)
    restart.run_batch(1, ListRunner([[100]]))
    left = unpinned_within(kafka_bootstrap, topic, BOUND_S)
    assert not left, f"pinned after the restart's first batch (LSO, HWM): {left}"
    values = sorted(json.loads(m.value())["id"] for m in read_topic(kafka_bootstrap, topic))
    assert values == [*range(WRITERS), 100]


@pytest.mark.parametrize("with_markers", [False, True], ids=["records", "records+markers"])
def test_phase_2_producers_are_kept_between_batches_and_a_fenced_one_is_replaced(
        kafka_bootstrap: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
        with_markers: bool) -> None:
    """A process keeps each participant's phase-2 producer for the next batch of its
    slot (no second ``init_transactions``). Another process that takes the slot's IDs
    (it fences the kept producers) and dies with transactions open (records, and with
    ``with_markers`` the marker offsets, which hold a ``require_stable`` marker read)
    does not make the next batch fail or pin a reader: each kept producer fails and is
    replaced by a fresh one, whose ``init_transactions`` aborts what the dead one left
    open. Every record is read once."""
    from sparkeos.connectors.kafka import clients, producers, publish

    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic, partitions=2)
    kwargs = sink_kwargs(kafka_bootstrap, topic, tmp_path, "staged")
    # The kept producers' marker read gives up after KEPT_MARKER_READ_S: no slow read of
    # a loaded machine may pass for a held one while nothing holds them (batches 1 to 3),
    # and a held read costs little once a dead twin holds them (batch 4, each of
    # WRITERS participants in turn).
    monkeypatch.setattr(publish, "KEPT_MARKER_READ_S", 60.0)
    coordinator = Coordinator(KafkaSink(**kwargs), CoordinatorConfig(name="pool-kept"),
                              CommitLog(LocalStore(str(tmp_path / "log"))), QUERY_KEY)
    inits = []
    fresh = producers.init_producer
    monkeypatch.setattr(producers, "init_producer",
                        lambda *args: inits.append(args[1].batch_id) or fresh(*args))

    def batch(batch_id: int) -> None:
        coordinator.run_batch(batch_id, ListRunner([[batch_id * 100 + p]
                                                    for p in range(WRITERS)]))

    clients.clear_caches()
    batch(0)
    batch(1)
    assert inits == [0] * WRITERS + [1] * WRITERS  # one producer per participant and slot
    kept = dict(clients._producers)
    assert len(kept) == 2 * WRITERS
    batch(2)
    batch(3)
    assert len(inits) == 2 * WRITERS  # batches 2 and 3 reused the producers
    # A twin of batch 4 (its commit on the slot-0 IDs, in another process) dies.
    die_with_open_transactions(kwargs, "pool-kept", batch_id=4, run=0,
                               guarantee=Guarantee.EXACTLY_ONCE, with_markers=with_markers)
    assert pinned(kafka_bootstrap, topic)
    monkeypatch.setattr(publish, "KEPT_MARKER_READ_S", 0.5)
    batch(4)
    assert inits[2 * WRITERS:] == [4] * WRITERS  # fenced, then replaced, each once
    replaced = [k for k in kept if clients._producers.get(k) is not kept[k]]
    assert len(replaced) == WRITERS  # slot 0's, kept since batch 2
    left = unpinned_within(kafka_bootstrap, topic, BOUND_S)
    assert not left, f"pinned after batch 4 (LSO, HWM): {left}"
    values = sorted(json.loads(m.value())["id"] for m in read_topic(kafka_bootstrap, topic))
    assert values == sorted(b * 100 + p for b in range(5) for p in range(WRITERS))
    clients.clear_caches()
