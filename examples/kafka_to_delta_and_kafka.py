"""The outbox, exactly once: Kafka -> a Delta Lake table and a Kafka topic, one decision.

Reads JSON orders such as {"id": 7, "amount": 12.5} from a topic (read_committed),
appends each order to a Delta table (delta-rs, no JVM: pip install 'sparkeos[delta]')
and an "order-received" event for it to a Kafka topic, both through one exactly_once:
a decided batch is committed in both (a crash between the two commits is finished by
the restart's recovery), an undecided one in neither. No outbox table, no relay. Kill
the driver at any moment and start it again with the same checkpoint: every order is
once in the table and its event once in the topic.

    export SPARKEOS_KAFKA_BOOTSTRAP=localhost:9092
    python examples/kafka_to_delta_and_kafka.py --input orders --table /data/orders \\
        --events order-events --checkpoint /tmp/checkpoints/outbox [--available-now]
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkeos import exactly_once
from sparkeos.connectors.delta import DeltaSink
from sparkeos.connectors.kafka import KafkaSink, kafka_source, spark_kafka_jars


def main() -> None:
    cli = argparse.ArgumentParser(description="Kafka -> Delta table + Kafka, one decision")
    cli.add_argument("--bootstrap", default=os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP",
                                                           "localhost:9092"))
    cli.add_argument("--input", required=True, help="topic of JSON orders")
    cli.add_argument("--table", required=True, help="the Delta table's path")
    cli.add_argument("--events", required=True, help="topic of order events")
    cli.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cli.add_argument("--max-per-batch", type=int, default=10_000, help="maxOffsetsPerTrigger")
    cli.add_argument("--available-now", action="store_true", help="process the input, stop")
    args = cli.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos too
    spark = (SparkSession.builder.appName("orders-outbox")
             .config("spark.jars", ",".join(spark_kafka_jars())).getOrCreate())
    orders = (kafka_source(spark, args.bootstrap, args.input,
                           maxOffsetsPerTrigger=args.max_per_batch)
              .select(F.from_json(F.col("value").cast("string"), "id long, amount double")
                      .alias("order")).select("order.*"))
    table = DeltaSink(args.table)
    events = KafkaSink(args.bootstrap, topic=args.events, key_column="id")

    def to_events(df):  # the events member gets its own projection of the batch
        return df.select("id", F.lit("order-received").alias("event"))

    sinks = {"orders": table, "events": (events, to_events)}
    writer = (orders.writeStream.foreachBatch(exactly_once(sinks, name="outbox"))
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
