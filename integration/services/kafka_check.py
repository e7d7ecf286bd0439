"""Prove that the Kafka broker really does transactions.

A transactional producer commits "c1", aborts "a1", commits "c2" on a fresh
one-partition topic. A read_committed consumer must see exactly [c1, c2]; a
read_uncommitted consumer must see [c1, a1, c2] (so the aborted record was
really written and is filtered by the broker's transaction markers, not lost).

    bash docker/services/kafka.sh start
    .venv/bin/python integration/services/kafka_check.py [BOOTSTRAP]

BOOTSTRAP defaults to $SPARKEOS_KAFKA_BOOTSTRAP, else 127.0.0.1:$SPARKEOS_KAFKA_PORT
(29092). Exit 0 and "OK" on success, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def read_all(
    bootstrap: str, topic: str, isolation: str, expect: int, timeout: float = 20.0
) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kafka-check-{isolation}-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + timeout
    idle_after_expect = 0
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                # once we have what we expect, wait a little longer for any extra record
                if len(got) >= expect:
                    idle_after_expect += 1
                    if idle_after_expect >= 4:
                        break
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(msg.error())
            got.append(msg.value().decode())
    finally:
        consumer.close()
    return got


def main() -> int:
    bootstrap = (
        sys.argv[1]
        if len(sys.argv) > 1
        else os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP")
        or f"127.0.0.1:{os.environ.get('SPARKEOS_KAFKA_PORT', '29092')}"
    )
    topic = f"sparkeos-kafka-check-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()

    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=10)
    print(f"broker(s): {[f'{b.host}:{b.port}' for b in md.brokers.values()]}")
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(15)

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"kafka-check-{uuid.uuid4().hex[:8]}",
            "enable.idempotence": True,
        }
    )
    producer.init_transactions(30)
    for value, commit in (("c1", True), ("a1", False), ("c2", True)):
        producer.begin_transaction()
        producer.produce(topic, value=value.encode())
        producer.flush(10)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        print(f"{'committed' if commit else 'aborted  '} {value}")

    committed = read_all(bootstrap, topic, "read_committed", expect=2)
    uncommitted = read_all(bootstrap, topic, "read_uncommitted", expect=3)
    print(f"read_committed   sees {committed}")
    print(f"read_uncommitted sees {uncommitted}")
    admin.delete_topics([topic])[topic].result(15)

    ok = committed == ["c1", "c2"] and uncommitted == ["c1", "a1", "c2"]
    print(f"{'OK' if ok else 'FAIL'}: transactions on {bootstrap} ({time.monotonic() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
