"""STOMP queue -> Kafka, exactly once.

Reads JSON messages from a STOMP queue (ActiveMQ Artemis, ActiveMQ Classic) with the
acknowledging stomp_source and publishes each body, keyed by its message ID, to a Kafka
topic through KafkaSink under exactly_once. A message is acknowledged on the broker
only after the batch holding it is committed to Kafka, and a redelivered message is
dropped by its ID: kill the driver at any moment and start it again with the same
checkpoint, and every message is in the topic once.

    export SPARKEOS_STOMP_URL=stomp://admin:admin@localhost:61613
    export SPARKEOS_KAFKA_BOOTSTRAP=localhost:9092
    python examples/stomp_to_kafka.py --queue orders --output orders \\
        --checkpoint /tmp/checkpoints/stomp-to-kafka [--available-now]

--available-now processes the messages waiting in the queue, then stops. The source
spools messages in $SPARKEOS_STOMP_SPOOL_DIR, the sink stages batches in
$SPARKEOS_KAFKA_STAGING_DIR (both under ~/.sparkeos by default): on a cluster, shared.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession

from sparkeos import exactly_once
from sparkeos.connectors.kafka import KafkaSink
from sparkeos.connectors.stomp import stomp_source


def main() -> None:
    cli = argparse.ArgumentParser(description="STOMP -> Kafka, exactly once")
    cli.add_argument("--stomp-url", default=os.environ.get("SPARKEOS_STOMP_URL",
                                                           "stomp://localhost:61613"))
    cli.add_argument("--bootstrap", default=os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP",
                                                           "localhost:9092"))
    cli.add_argument("--queue", required=True, help="STOMP queue of JSON messages")
    cli.add_argument("--output", required=True, help="Kafka topic")
    cli.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cli.add_argument("--max-per-batch", type=int, default=10_000, help="messages per batch")
    cli.add_argument("--available-now", action="store_true", help="drain the queue, stop")
    args = cli.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos too
    spark = SparkSession.builder.appName("stomp-to-kafka").getOrCreate()
    messages = stomp_source(spark, args.stomp_url, args.queue, body_format="json",
                            max_batch_messages=args.max_per_batch)
    records = messages.selectExpr("message_id AS key", "body AS value")
    sink = KafkaSink(args.bootstrap, topic=args.output, key_column="key", value_column="value")
    writer = (records.writeStream.foreachBatch(exactly_once(sink, name="stomp-to-kafka"))
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
