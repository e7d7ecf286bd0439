"""Spark's kafka sink and ``format("sparkeos-kafka")`` on one batch (test harness).

    python -m integration.connectors.kafka.layout_job spec.json

The spec names the bootstrap servers, a working directory and, per writer, the topic
each kind of row goes to (``spark``: Spark's ``df.write.format("kafka")``; ``ours``: a
stream of the same rows through ``writeStream.format("sparkeos-kafka")`` with the same
options and columns). ``layout`` rows try keys, values and headers at their edges (a
one-partition topic keeps their order); ``keyed`` rows spread over several partitions
by their keys.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SCHEMA = ("kind string, key string, value binary, "
          "headers array<struct<key:string,value:binary>>")
LAYOUT_ROWS: list[tuple[Any, ...]] = [
    ("layout", "a", b"one", [("trace", b"x1"), ("empty", b"")]),
    ("layout", None, b"\x00\xff\x80", None),
    ("layout", "", b"", []),
    ("layout", "\u00e9\u5b57\U0001f600", None, [("no-value", None), ("trace", b"x2")]),
]
KEYED_ROWS: list[tuple[Any, ...]] = [
    ("keyed", f"key-{i}", f"value-{i}".encode(), None) for i in range(24)]


def main(argv: list[str]) -> int:
    from pyspark.sql import functions as F

    from sparkeos.connectors.kafka import spark_kafka_jars
    from sparkeos.core.streaming.spark import local_session
    from sparkeos.testing.job import end_job

    with open(argv[0]) as fh:
        spec = json.load(fh)
    spark = local_session("sparkeos-kafka-layout", "local[2]",
                          {"spark.jars": ",".join(spark_kafka_jars())})

    def to_topics(df: Any, topics: dict[str, str]) -> Any:
        topic = F.when(F.col("kind") == "layout", F.lit(topics["layout"])).otherwise(
            F.lit(topics["keyed"]))
        return df.withColumn("topic", topic).drop("kind")

    batch = spark.createDataFrame(LAYOUT_ROWS + KEYED_ROWS, SCHEMA).coalesce(1)
    (to_topics(batch, spec["spark"]).write.format("kafka")
     .option("kafka.bootstrap.servers", spec["bootstrap"]).save())
    source = os.path.join(spec["workdir"], "in")
    batch.write.parquet(source)
    stream = spark.readStream.schema(SCHEMA).parquet(source)
    query = (to_topics(stream, spec["ours"]).writeStream.format("sparkeos-kafka")
             .option("kafka.bootstrap.servers", spec["bootstrap"])
             # a name of its own: a sink with a topic column is known by its name on the
             # shared marker topic, and each run of the test is a new query
             .option("sparkeos.name", spec["name"])
             .option("checkpointLocation", os.path.join(spec["workdir"], "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    print("layout job ok", flush=True)
    return end_job(spark)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
