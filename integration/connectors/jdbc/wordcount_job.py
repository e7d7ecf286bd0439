"""A running word count in update mode, upserted into PostgreSQL exactly once.

    python -m integration.connectors.jdbc.wordcount_job spec.json
    python -m integration.connectors.jdbc.wordcount_job --ahead '{}'   (sparkeos.testing.ahead)

The spec names the input directory (JSON lines ``{"word": ...}``, one file per batch),
the checkpoint, the DSN, the table and the marker table. Faults come from
``SPARKEOS_FAULT``, as in ``sparkeos.testing.job``.
"""

from __future__ import annotations

import json
import sys

from sparkeos.testing import ahead
from sparkeos.testing.job import end_job


def main(argv: list[str]) -> int:
    from sparkeos import exactly_once
    from sparkeos.connectors.jdbc import PostgresSink
    from sparkeos.core.streaming.spark import local_session

    spark = local_session("sparkeos-wordcount", conf={"spark.sql.shuffle.partitions": "3"})
    spec_path = ahead.spec_path(argv)
    if spec_path is None:  # started ahead, not needed
        return end_job(spark)
    with open(spec_path) as fh:
        spec = json.load(fh)
    words = (spark.readStream.schema("word string").option("maxFilesPerTrigger", 1)
             .json(spec["input"]))
    counts = words.groupBy("word").count()
    sink = PostgresSink(dsn=spec["dsn"], table=spec["table"], key=["word"], mode="upsert",
                        create_table=True, marker_table=spec["marker"])
    query = (counts.writeStream.outputMode("update")
             .foreachBatch(exactly_once(sink, name="wordcount"))
             .option("checkpointLocation", spec["checkpoint"])
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return end_job(spark)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
