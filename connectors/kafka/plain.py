"""The plain foreachBatch Kafka producer users write without sparkeos (at-least-once).

Used as the baseline by the conformance suite (a crash after the write and before
Spark records the batch duplicates it) and by ``bench/kafka_sink.py``. It produces
with an idempotent, non-transactional confluent-kafka producer per task, from Arrow
batches (``mapInArrow``), with the same record encoding as ``KafkaSink``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from sparkeos.core.text.records import RecordLayout, iter_records


def plain_foreachbatch_writer(
    bootstrap_servers: str,
    topic: str,
    key_column: str | None = None,
    value_column: str | None = None,
    value_format: str | None = None,
    producer_config: Mapping[str, Any] | None = None,
) -> Callable[[Any, int], None]:
    """A foreachBatch function producing every row of the batch to ``topic``."""
    layout = RecordLayout(topic, None, key_column, value_column, None, None, value_format)
    config = {**(producer_config or {}), "bootstrap.servers": bootstrap_servers,
              "enable.idempotence": True}

    def produce_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from confluent_kafka import Producer

        producer = Producer(config)
        rows = 0
        for batch in batches:
            records = layout.serialize(batch)
            for _topic, value, key, _headers in iter_records(records):
                while True:
                    try:
                        producer.produce(topic, value, key)
                        break
                    except BufferError:
                        producer.poll(0.1)
            producer.poll(0)
            rows += batch.num_rows
        left = producer.flush(120)
        if left:
            raise RuntimeError(f"{left} records not delivered to {topic}")
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    def write(df: Any, batch_id: int) -> None:
        df.mapInArrow(produce_partition, "rows long").collect()

    return write
