"""Kafka -> transform -> Kafka, exactly once.

Reads JSON orders such as {"id": 7, "amount": 12.5} from an input topic (read_committed:
records of aborted upstream transactions are skipped), adds the amount in cents, and
writes every order as a JSON record keyed by its id to an output topic through
KafkaSink under exactly_once. Kill the driver at any moment and start it again with
the same checkpoint: every input record is in the output once.

    export SPARKEOS_KAFKA_BOOTSTRAP=localhost:9092
    python examples/kafka_to_kafka.py --input orders --output orders-cents \\
        --checkpoint /tmp/checkpoints/kafka-to-kafka [--available-now]

--available-now processes what the input holds, then stops. Spark's Kafka source jars:
spark_kafka_jars(). Batches are staged under the checkpoint (<checkpoint>/sparkeos-staging/),
or in $SPARKEOS_KAFKA_STAGING_DIR when set: on a cluster, put the checkpoint on HDFS or a
shared mount.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkeos import exactly_once
from sparkeos.connectors.kafka import KafkaSink, kafka_source, spark_kafka_jars


def main() -> None:
    cli = argparse.ArgumentParser(description="Kafka -> transform -> Kafka, exactly once")
    cli.add_argument("--bootstrap", default=os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP",
                                                           "localhost:9092"))
    cli.add_argument("--input", required=True, help="topic of JSON orders")
    cli.add_argument("--output", required=True, help="topic the enriched orders go to")
    cli.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cli.add_argument("--max-per-batch", type=int, default=10_000, help="maxOffsetsPerTrigger")
    cli.add_argument("--available-now", action="store_true", help="process the input, stop")
    args = cli.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos too
    spark = (SparkSession.builder.appName("kafka-to-kafka")
             .config("spark.jars", ",".join(spark_kafka_jars())).getOrCreate())
    source = kafka_source(spark, args.bootstrap, args.input,
                          maxOffsetsPerTrigger=args.max_per_batch)
    orders = (source.select(F.from_json(F.col("value").cast("string"),
                                        "id long, amount double").alias("order"))
              .select("order.*")
              .withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long")))
    sink = KafkaSink(args.bootstrap, topic=args.output, key_column="id")  # value: row as JSON
    writer = (orders.writeStream.foreachBatch(exactly_once(sink, name="orders-cents"))
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
