"""Streaming JSON files -> Parquet, exactly once.

Reads JSON Lines files ({"id": 7, "payload": "..."}) as they arrive in an input
directory, adds each payload's length, and writes the rows as Parquet part files
through FileSink under exactly_once. A batch's files appear whole, once: kill the
driver at any moment and start it again with the same checkpoint, and no row is lost
or written twice (readers never see the hidden staging files).

    python examples/files_to_parquet.py --input /data/incoming --output /data/orders \\
        --checkpoint /tmp/checkpoints/files-to-parquet [--available-now]

--available-now processes the files that are there, then stops. Read the output with
spark.read.parquet(output), pandas or pyarrow.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkeos import exactly_once
from sparkeos.connectors.file import FileSink


def main() -> None:
    cli = argparse.ArgumentParser(description="JSON files -> Parquet, exactly once")
    cli.add_argument("--input", required=True, help="directory of JSON Lines files")
    cli.add_argument("--output", required=True, help="directory of the Parquet output")
    cli.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    cli.add_argument("--max-files-per-batch", type=int, default=100, help="maxFilesPerTrigger")
    cli.add_argument("--available-now", action="store_true", help="process the input, stop")
    args = cli.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import sparkeos too
    spark = SparkSession.builder.appName("files-to-parquet").getOrCreate()
    rows = (spark.readStream.schema("id long, payload string")
            .option("maxFilesPerTrigger", args.max_files_per_batch).json(args.input)
            .withColumn("payload_length", F.length("payload")))
    sink = FileSink(args.output, format="parquet")
    writer = (rows.writeStream.foreachBatch(exactly_once(sink, name="orders-parquet"))
              .option("checkpointLocation", args.checkpoint))
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
