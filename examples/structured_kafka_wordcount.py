"""Spark's own structured_kafka_wordcount.py, writing its counts to Kafka exactly once.

Spark's example counts the words of a Kafka topic in outputMode("complete") and prints
them; this port writes them as Spark's format("kafka") would (key = word, value = its
count, every batch). The one change from that Kafka version is the format's name,
"kafka" -> "sparkeos-kafka" (after sparkeos.register(spark)): a batch replayed after a
crash is published once, and a read_committed reader sees each batch's counts once.

    python examples/structured_kafka_wordcount.py localhost:9092 subscribe lines \\
        wordcounts /tmp/checkpoints/wordcount [--available-now]
SPARKEOS_WORDCOUNT_MAX_OFFSETS sets maxOffsetsPerTrigger (the tests read in batches).
"""

import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import explode, split

import sparkeos
from sparkeos.connectors.kafka import spark_kafka_jars

SINK_FORMAT = "sparkeos-kafka"  # Spark's own: "kafka" (at-least-once)

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--available-now"]
    if len(args) != 5:
        print("Usage: structured_kafka_wordcount.py <bootstrap-servers> <subscribe-type> "
              "<topics> <output-topic> <checkpoint> [--available-now]",
              file=sys.stdout if "--help" in args else sys.stderr)
        sys.exit(0 if "--help" in args else -1)
    bootstrapServers, subscribeType, topics, outputTopic, checkpoint = args
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos

    # Each partition of a batch is one Kafka transaction: a few, not Spark's default 200
    spark = SparkSession.builder.appName("StructuredKafkaWordCount")\
        .config("spark.sql.shuffle.partitions", "4")\
        .config("spark.jars", ",".join(spark_kafka_jars())).getOrCreate()
    sparkeos.register(spark)

    # Create DataSet representing the stream of input lines from kafka (from the start)
    reader = spark.readStream.format("kafka")\
        .option("kafka.bootstrap.servers", bootstrapServers)\
        .option(subscribeType, topics)\
        .option("startingOffsets", "earliest")
    if os.environ.get("SPARKEOS_WORDCOUNT_MAX_OFFSETS"):
        reader = reader.option("maxOffsetsPerTrigger",
                               os.environ["SPARKEOS_WORDCOUNT_MAX_OFFSETS"])
    lines = reader.load().selectExpr("CAST(value AS STRING)")

    # Split the lines into words
    words = lines.select(
        # explode turns each item in an array into a separate row
        explode(split(lines.value, ' ')).alias('word')
    )

    # Generate running word count
    wordCounts = words.groupBy('word').count()

    # Write the running counts to Kafka: key = the word, value = its count
    writer = wordCounts.selectExpr("word AS key", "CAST(count AS STRING) AS value")\
        .writeStream\
        .outputMode('complete')\
        .format(SINK_FORMAT)\
        .option("kafka.bootstrap.servers", bootstrapServers)\
        .option("topic", outputTopic)\
        .option("checkpointLocation", checkpoint)
    if "--available-now" in sys.argv:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()
