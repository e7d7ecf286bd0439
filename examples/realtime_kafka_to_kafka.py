"""Kafka -> transform -> Kafka in Spark's real-time mode, exactly once.

The orders of kafka_to_kafka.py with the amount in cents, keyed by id. Each partition's
records of an epoch are one Kafka transaction, seen by a read_committed consumer when
the epoch ends. Kill the driver at any moment and start it again with the same
checkpoint: every input record is in the output once (docs/realtime.md).
    export SPARKEOS_KAFKA_BOOTSTRAP=localhost:9092
    python examples/realtime_kafka_to_kafka.py --input orders --output orders-cents \\
        --checkpoint /tmp/checkpoints/realtime-orders [--epoch-seconds 5] [--available-now]

--available-now: stop after an epoch (not the run's first) that ended where it began,
for an input produced beforehand (real-time mode itself runs until stopped).
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkeos import exactly_once_writer
from sparkeos.connectors.kafka import KafkaSink, kafka_source, spark_kafka_jars


def main() -> None:
    cli = argparse.ArgumentParser(description="Kafka -> Kafka in real-time mode, exactly once")
    cli.add_argument("--bootstrap", default=os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP",
                                                           "localhost:9092"))
    cli.add_argument("--input", required=True, help="topic of JSON orders")
    cli.add_argument("--output", required=True, help="topic the enriched orders go to")
    cli.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cli.add_argument("--epoch-seconds", type=int, default=5, help="the epoch (the latency)")
    cli.add_argument("--available-now", action="store_true", help="stop once idle")
    args = cli.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos too
    spark = (SparkSession.builder.appName("realtime-kafka-to-kafka")
             .config("spark.jars", ",".join(spark_kafka_jars()))
             .config("spark.sql.streaming.realTimeMode.minBatchDuration",
                     str(args.epoch_seconds * 1000)).getOrCreate())
    orders = (kafka_source(spark, args.bootstrap, args.input)
              .select(F.from_json(F.col("value").cast("string"),
                                  "id long, amount double").alias("order")).select("order.*")
              .withColumn("amount_cents", F.round(F.col("amount") * 100).cast("long")))
    writer = exactly_once_writer(KafkaSink(args.bootstrap, topic=args.output, key_column="id"),
                                 name="orders-cents", checkpoint_location=args.checkpoint)
    query = (orders.writeStream.foreach(writer).outputMode("update")
             .option("checkpointLocation", args.checkpoint)
             .trigger(realTime=f"{args.epoch_seconds} seconds").start())
    first = None  # the run's first epoch may read nothing while its consumer starts
    while args.available_now and query.isActive:
        first = (query.lastProgress or {}).get("batchId") if first is None else first
        if idle(query.lastProgress) and query.lastProgress["batchId"] != first:
            query.stop()
        query.awaitTermination(1)
    query.awaitTermination()


def idle(progress: dict | None) -> bool:
    """An epoch that ended where it began: the input is read (to its end, for now)."""
    sources = (progress or {}).get("sources") or [{}]
    return all(s.get("startOffset") not in (None, "null")
               and s["startOffset"] == s["endOffset"] for s in sources)  # one writer's JSON


if __name__ == "__main__":
    main()
