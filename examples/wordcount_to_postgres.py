"""Kafka -> running word count (update mode) -> PostgreSQL upsert, exactly once.

Splits the lines of a Kafka topic into words, counts them with a stateful
groupBy("word").count() in outputMode("update"), and upserts each batch's changed
counts into a PostgreSQL table (INSERT ... ON CONFLICT (word) DO UPDATE) through
PostgresSink(mode="upsert") under exactly_once: a batch's counts are applied once,
with its marker rows. Kill the driver at any moment and start it again with the same
checkpoint: the table ends with the exact counts.

    export SPARKEOS_KAFKA_BOOTSTRAP=localhost:9092
    export SPARKEOS_POSTGRES_DSN=postgresql://app@localhost:5432/shop
    python examples/wordcount_to_postgres.py --input lines --table wordcount \\
        --checkpoint /tmp/checkpoints/wordcount [--available-now]

--available-now processes what the topic holds, then stops.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkeos import exactly_once
from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.connectors.kafka import kafka_source, spark_kafka_jars


def main() -> None:
    cli = argparse.ArgumentParser(description="word count -> PostgreSQL, exactly once")
    cli.add_argument("--bootstrap", default=os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP",
                                                           "localhost:9092"))
    dsn = os.environ.get("SPARKEOS_POSTGRES_DSN")
    cli.add_argument("--dsn", default=dsn, required=not dsn, help="PostgreSQL DSN or URL")
    cli.add_argument("--input", required=True, help="topic of text lines")
    cli.add_argument("--table", default="wordcount")
    cli.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cli.add_argument("--max-per-batch", type=int, default=10_000, help="maxOffsetsPerTrigger")
    cli.add_argument("--available-now", action="store_true", help="process the input, stop")
    args = cli.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos too
    spark = (SparkSession.builder.appName("wordcount")
             .config("spark.jars", ",".join(spark_kafka_jars()))
             .config("spark.sql.shuffle.partitions", "4")  # Spark's 200: slow when small
             .getOrCreate())
    lines = kafka_source(spark, args.bootstrap, args.input,
                         maxOffsetsPerTrigger=args.max_per_batch)
    words = lines.select(F.explode(F.split(F.col("value").cast("string"), r"\s+")).alias("word"))
    counts = words.where("word != ''").groupBy("word").count()  # columns: word, count
    sink = PostgresSink(dsn=args.dsn, table=args.table, key=["word"], mode="upsert",
                        create_table=True)
    writer = (counts.writeStream.outputMode("update")
              .foreachBatch(exactly_once(sink, name="wordcount"))
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
